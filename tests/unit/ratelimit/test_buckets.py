"""LocalBuckets, the reference model of the Lua scripts: properties with simulated time."""

from __future__ import annotations

import copy
import math
from fractions import Fraction

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from redis.crc import key_slot

from gateway.ratelimit.buckets import (
    EXPIRE_MARGIN_MS,
    BucketKeys,
    BucketResult,
    BucketSpec,
    LeaseResult,
    LeaseSpec,
    LocalBuckets,
    LocalDebts,
    TakeResult,
    bucket_key,
    bucket_keys,
    wait_ms,
)
from gateway.storage.redis_keys import hash_tag

# A realistic clock (Redis TIME in ms); whole ms stay exact in floats up to 2^53.
T0 = 1_700_000_000_000

capacities = st.one_of(st.integers(1, 100), st.floats(0.5, 1000, allow_nan=False))
rates = st.one_of(
    st.sampled_from([0.001, 0.01, 0.1, 1 / 3, 0.5, 1.0, 2.5]),
    st.floats(1e-4, 10, allow_nan=False),
)
costs = st.one_of(st.integers(0, 120), st.floats(0, 120, allow_nan=False))
gaps = st.one_of(st.integers(0, 2000), st.sampled_from([0, 1, 2]))


def bucket(key: str, capacity: float, rate: float, cost: float) -> BucketSpec:
    return BucketSpec(key, capacity, rate, cost)


def refilled_level(store: LocalBuckets, spec: BucketSpec, now: float) -> float:
    """The level `spec`'s bucket has at `now`, read on a copy (nothing is changed)."""
    probe = copy.deepcopy(store)
    zero = BucketSpec(spec.key, spec.capacity, spec.refill_per_ms, 0)
    return probe.take([zero], None, now).buckets[0].remaining


# -- one bucket: limits and exactness -------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(capacity=capacities, rate=rates, steps=st.lists(st.tuples(gaps, costs), max_size=40))
def test_admitted_never_exceeds_capacity_plus_refill(
    capacity: float, rate: float, steps: list[tuple[int, float]]
) -> None:
    store, now, admitted = LocalBuckets(), float(T0), 0.0
    for gap, cost in steps:
        now += gap
        if store.take([bucket("b", capacity, rate, cost)], None, now).allowed:
            admitted += cost
    elapsed = now - T0
    assert admitted <= capacity + rate * elapsed + 1e-9 * (capacity + rate * elapsed)


def exact_wait(level: Fraction, target: Fraction, rate: Fraction) -> int:
    if level >= target:
        return 0
    return -1 if rate == 0 else math.ceil((target - level) / rate)


@settings(max_examples=300, deadline=None)
@given(
    capacity=st.integers(1, 64),
    rate_num=st.integers(0, 64),
    rate_shift=st.integers(0, 8),
    steps=st.lists(
        st.tuples(st.integers(0, 500), st.sampled_from(["take", "adjust"]), st.integers(-80, 80)),
        max_size=40,
    ),
)
def test_decisions_equal_exact_arithmetic(
    capacity: int, rate_num: int, rate_shift: int, steps: list[tuple[int, str, int]]
) -> None:
    """With dyadic rates and whole numbers every float is exact: the store must agree with
    rational arithmetic on every decision, level, retry and reset."""
    rate = Fraction(rate_num, 2**rate_shift)
    store, now = LocalBuckets(), T0
    level = Fraction(capacity)
    for gap, op, amount in steps:
        now += gap
        level = min(Fraction(capacity), level + gap * rate)
        spec = bucket("b", capacity, float(rate), amount if op == "adjust" else abs(amount))
        if op == "adjust":
            level = min(Fraction(capacity), level - amount)
            adjusted = store.adjust(spec, None, now)
            assert adjusted.remaining == [level]
            continue
        cost = abs(amount)
        fits = cost <= capacity and level >= cost
        result = store.take([spec], None, now)
        if fits:
            level -= cost
        assert result.allowed is fits
        assert result.buckets[0].remaining == level
        assert result.buckets[0].reset_ms == exact_wait(level, Fraction(capacity), rate)
        expected_retry = (
            0 if fits else (-1 if cost > capacity else exact_wait(level, Fraction(cost), rate))
        )
        assert result.buckets[0].retry_after_ms == expected_retry


@settings(max_examples=300, deadline=None)
@given(
    capacity=capacities,
    rate=rates,
    history=st.lists(st.tuples(gaps, costs), max_size=10),
    cost=costs,
)
def test_retry_after_is_exact(
    capacity: float, rate: float, history: list[tuple[int, float]], cost: float
) -> None:
    """A refused request fits after exactly retry_after_ms, and not 1 ms earlier."""
    store, now = LocalBuckets(), T0
    for gap, spent in history:
        now += gap
        store.take([bucket("b", capacity, rate, spent)], None, now)
    spec = bucket("b", capacity, rate, cost)
    result = store.take([spec], None, now)
    retry = result.buckets[0].retry_after_ms
    if result.allowed:
        assert retry == 0
        return
    if cost > capacity:
        assert retry == -1
        return
    assert retry >= 1
    assert result.retry_after_ms == retry
    early, on_time = copy.deepcopy(store), copy.deepcopy(store)
    assert not early.take([spec], None, now + retry - 1).allowed
    assert on_time.take([spec], None, now + retry).allowed


# Where the rounded quotient's ceiling is one too many, and one too few.
@example(level=94.0, target=97.683, rate=0.001)
@example(level=1.6518368071287313, target=18665.430691309317, rate=4.534445785836294)
@given(
    level=st.floats(-1e6, 1e6, allow_nan=False),
    target=st.floats(0, 1e6, allow_nan=False),
    rate=st.floats(1e-6, 1e3, allow_nan=False),
)
def test_wait_ms_is_the_least_whole_wait(level: float, target: float, rate: float) -> None:
    w = wait_ms(level, target, rate)
    assert level + w * rate >= target
    assert w == 0 or level + (w - 1) * rate < target


# -- several buckets: all or nothing ----------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    specs=st.lists(st.tuples(capacities, rates, costs), min_size=1, max_size=4),
    history=st.lists(st.tuples(gaps, st.integers(0, 3), costs), max_size=12),
    gap=gaps,
)
def test_take_is_all_or_nothing(
    specs: list[tuple[float, float, float]],
    history: list[tuple[int, int, float]],
    gap: int,
) -> None:
    buckets = [bucket(f"b{i}", c, r, cost) for i, (c, r, cost) in enumerate(specs)]
    store, now = LocalBuckets(), T0
    for step, index, spent in history:
        now += step
        b = buckets[index % len(buckets)]
        store.take([BucketSpec(b.key, b.capacity, b.refill_per_ms, spent)], None, now)
    now += gap
    levels = [refilled_level(store, b, now) for b in buckets]
    fits = [
        b.cost <= b.capacity and level >= b.cost for b, level in zip(buckets, levels, strict=True)
    ]

    result = store.take(buckets, None, now)

    assert result.allowed is all(fits)
    assert [r.allowed for r in result.buckets] == fits
    for b, level, outcome in zip(buckets, levels, result.buckets, strict=True):
        taken = min(b.capacity, level - b.cost) if result.allowed else level
        assert outcome.remaining == taken
        assert refilled_level(store, b, now) == taken


def test_cost_above_capacity_can_never_fit_and_takes_nothing() -> None:
    store = LocalBuckets()
    small = bucket("small", 10, 1.0, 11)
    other = bucket("other", 100, 1.0, 5)
    result = store.take([other, small], None, T0)
    assert not result.allowed
    assert result.buckets[1] == BucketResult(False, 10.0, -1, 0)
    assert result.buckets[0] == BucketResult(True, 100.0, 0, 0)
    assert result.retry_after_ms == -1
    assert store.take([other], None, T0).buckets[0].remaining == 95


def test_lease_refusal_takes_no_tokens_and_bucket_refusal_no_lease() -> None:
    store = LocalBuckets()
    tokens = bucket("tok", 100, 0.1, 10)
    full = LeaseSpec("inflight", "a", 0, 1000)
    refused = store.take([tokens], full, T0)
    assert not refused.allowed
    assert refused.lease == LeaseResult(False, 0)
    assert refused.buckets[0] == BucketResult(True, 100.0, 0, 0)
    assert refused.retry_after_ms == 0  # only the lease refused: no clock predicts a slot

    too_big = bucket("tok", 100, 0.1, 1000)
    refused = store.take([too_big], LeaseSpec("inflight", "a", 5, 1000), T0)
    assert refused.lease == LeaseResult(True, 0)
    assert store.in_flight("inflight", T0) == 0


# -- adjust: refunds, charges, debt -----------------------------------------------------


def test_refund_is_capped_at_capacity() -> None:
    store = LocalBuckets()
    spec = bucket("tok", 100, 0.5, 30)
    assert store.take([spec], None, T0).buckets[0].remaining == 70
    refund = BucketSpec("tok", 100, 0.5, -1000)
    assert store.adjust(refund, None, T0 + 10).remaining == [100.0]


def test_debt_is_repaid_by_refill_before_the_next_request_fits() -> None:
    store = LocalBuckets()
    assert store.adjust(bucket("tok", 10, 0.01, 30), None, T0).remaining == [-20.0]
    need_one = bucket("tok", 10, 0.01, 1)
    result = store.take([need_one], None, T0)
    assert not result.allowed
    assert result.buckets[0].retry_after_ms == 2100  # 21 tokens at 0.01 per ms
    assert result.buckets[0].reset_ms == 3000
    assert not copy.deepcopy(store).take([need_one], None, T0 + 2099).allowed
    assert store.take([need_one], None, T0 + 2100).allowed


@settings(max_examples=200, deadline=None)
@given(
    capacity=capacities,
    rate=rates,
    steps=st.lists(st.tuples(gaps, st.floats(-200, 200, allow_nan=False)), max_size=20),
)
def test_adjust_never_exceeds_capacity(
    capacity: float, rate: float, steps: list[tuple[int, float]]
) -> None:
    store, now = LocalBuckets(), T0
    for gap, delta in steps:
        now += gap
        before = refilled_level(store, bucket("b", capacity, rate, 0), now)
        after = store.adjust(bucket("b", capacity, rate, delta), None, now).remaining[0]
        assert after <= capacity
        assert after == min(capacity, before - delta)


def test_adjust_several_buckets_and_a_lease_alone() -> None:
    store = LocalBuckets()
    lease = LeaseSpec("inflight", "r1", 1, 1000)
    store.take([bucket("a", 10, 1, 2)], lease, T0)
    result = store.adjust([bucket("a", 10, 1, 3), bucket("b", 10, 1, 4)], None, T0)
    assert result.remaining == [5.0, 6.0]
    assert not result.lease_held
    assert store.adjust(None, lease, T0).lease_held
    assert store.in_flight("inflight", T0) == 0
    with pytest.raises(ValueError, match="exclude"):
        store.adjust(None, lease, T0, renew=lease)


# -- leases -----------------------------------------------------------------------------


def test_leases_limit_in_flight_and_expire() -> None:
    store = LocalBuckets()

    def lease(member: str) -> LeaseSpec:
        return LeaseSpec("inflight", member, 2, 100)

    assert store.take([], lease("a"), T0).lease == LeaseResult(True, 1)
    assert store.take([], lease("b"), T0 + 10).lease == LeaseResult(True, 2)
    assert store.take([], lease("c"), T0 + 20).lease == LeaseResult(False, 2)
    # A member that holds a slot (a retried call) keeps it without taking another.
    assert store.take([], lease("a"), T0 + 20).lease == LeaseResult(True, 2)
    # "a" was renewed at T0+20: "b" expires first, exactly at T0+110.
    assert store.take([], lease("c"), T0 + 109).lease == LeaseResult(False, 2)
    assert store.take([], lease("c"), T0 + 110).lease == LeaseResult(True, 2)
    assert store.in_flight("inflight", T0 + 120) == 1
    assert store.in_flight("inflight", T0 + 210) == 0


def test_release_frees_a_slot_and_renew_extends_it() -> None:
    store = LocalBuckets()
    a, b = LeaseSpec("inflight", "a", 1, 100), LeaseSpec("inflight", "b", 1, 100)
    assert store.take([], a, T0).allowed
    assert not store.take([], b, T0).allowed
    assert store.adjust(None, None, T0 + 90, renew=a).lease_held
    assert not store.take([], b, T0 + 150).allowed  # renewed until T0+190
    assert store.adjust(None, a, T0 + 160).lease_held
    assert store.take([], b, T0 + 160).allowed
    # Renewing or releasing an expired lease finds nothing: it is not brought back.
    assert not store.adjust(None, None, T0 + 260, renew=b).lease_held
    assert not store.adjust(None, b, T0 + 260).lease_held


# -- clock and storage details ----------------------------------------------------------


def test_a_clock_that_goes_back_refills_nothing() -> None:
    store = LocalBuckets()
    spec = bucket("b", 10, 1.0, 4)
    store.take([spec], None, T0 + 1000)
    assert store.take([spec], None, T0).buckets[0].remaining == 2
    state = store.state("b", T0)
    assert state is not None and state.ts_ms == T0 + 1000
    # No refill until the clock passes the last call again.
    assert not store.take([spec], None, T0 + 1000).allowed
    assert store.take([spec], None, T0 + 1002).buckets[0].remaining == 0


def test_idle_buckets_expire_once_full() -> None:
    store = LocalBuckets()
    spec = bucket("b", 10, 0.01, 5)
    result = store.take([spec], None, T0)
    assert result.buckets[0].reset_ms == 500
    assert store.state("b", T0 + 500 + EXPIRE_MARGIN_MS) is not None
    assert store.state("b", T0 + 501 + EXPIRE_MARGIN_MS) is None
    store.sweep(T0 + 501 + EXPIRE_MARGIN_MS)
    assert len(store) == 0


def test_zero_refill_never_refills_and_never_expires() -> None:
    store = LocalBuckets()
    spec = bucket("quota", 3, 0, 2)
    assert store.take([spec], None, T0).buckets[0] == BucketResult(True, 1.0, 0, -1)
    refused = store.take([spec], None, T0 + 10**9)
    assert refused.buckets[0] == BucketResult(False, 1.0, -1, -1)
    assert store.state("quota", T0 + 10**12) is not None


def test_sweep_runs_every_n_writes() -> None:
    store = LocalBuckets(sweep_every=10)
    for i in range(9):
        store.take([bucket(f"b{i}", 1, 1, 1)], None, T0)
    assert len(store) == 9
    store.take([bucket("last", 1, 1, 1)], None, T0 + 10_000)
    assert len(store) == 1


def test_take_result_retry_after_is_the_longest_wait() -> None:
    slow = BucketResult(False, 0, 300, 900)
    fast = BucketResult(False, 0, 20, 40)
    fine = BucketResult(True, 5, 0, 10)
    assert TakeResult(False, [fine, slow, fast], None, T0).retry_after_ms == 300
    never = BucketResult(False, 0, -1, 10)
    assert TakeResult(False, [slow, never], None, T0).retry_after_ms == -1


@pytest.mark.parametrize(
    ("capacity", "rate", "cost"),
    [
        (0, 1, 1),
        (-1, 1, 1),
        (math.inf, 1, 1),
        (math.nan, 1, 1),
        (1, -0.5, 1),  # -1 and -2 are the periods of spend budgets
        (1, -3, 1),
        (1, math.nan, 1),
        (1, 1, math.inf),
        (1, 1, math.nan),
    ],
)
def test_bucket_spec_rejects_impossible_limits(capacity: float, rate: float, cost: float) -> None:
    with pytest.raises(ValueError):
        BucketSpec("b", capacity, rate, cost)


# -- keys -------------------------------------------------------------------------------


def test_keys_carry_the_tenant_hash_tag() -> None:
    keys = bucket_keys("gw", "acme", "llm-large")
    assert keys == BucketKeys(
        requests="gw:{acme}:requests",
        tokens="gw:{acme}:tokens",
        model_requests="gw:{acme}:requests:llm-large",
        model_tokens="gw:{acme}:tokens:llm-large",
        inflight="gw:{acme}:inflight",
    )
    assert bucket_keys("gw", "acme", "llm-large") is keys  # cached
    assert bucket_key("gw", "a{b}c", "tokens") == "gw:{a%7Bb%7Dc}:tokens"


@given(tenant=st.text(min_size=1, max_size=20), model=st.text(max_size=10))
def test_every_key_of_a_tenant_lands_in_one_slot(tenant: str, model: str) -> None:
    keys = bucket_keys("gw", tenant, model)
    slots = {
        key_slot(k.encode())
        for k in (keys.requests, keys.tokens, keys.model_tokens, keys.model_requests, keys.inflight)
    }
    assert slots == {key_slot(hash_tag(tenant).encode())}


def test_bad_prefix_or_tenant_is_refused() -> None:
    with pytest.raises(ValueError, match="braces"):
        bucket_key("gw{x}", "acme", "requests")
    with pytest.raises(ValueError, match="empty"):
        bucket_key("gw", "", "requests")


def test_a_take_of_a_negative_cost_is_refused() -> None:
    """A negative take would add tokens; refunds go through adjust."""
    store = LocalBuckets()
    with pytest.raises(ValueError, match="cost must be >= 0"):
        store.take([BucketSpec("k", 10, 0.01, -1)], None, 0)


# -- LocalDebts: what local buckets owe Redis after an outage -----------------------------


def test_an_emptied_bucket_owes_what_it_handed_out_during_the_outage() -> None:
    """The tenant had emptied its bucket; the local bucket then hands out its refill. Redis
    refilled as much meanwhile, so that is what Redis is charged."""
    local = LocalBuckets()
    debts = LocalDebts(local)
    whole = bucket("b", 10, 0.002, 0)  # two a second
    local.seed("b", 0, 10, 0.002, T0)
    admitted = 0
    for second in range(1, 4):
        now = T0 + second * 1000
        one = bucket("b", 10, 0.002, 1)
        debts.track(one, whole, now)
        while local.take([one], None, now).allowed:
            admitted += 1
    assert admitted == 6
    [charge] = debts.collect(T0 + 3000)
    assert (charge.key, charge.capacity, charge.refill_per_ms) == ("b", 10, 0.002)
    assert charge.cost == pytest.approx(6)
    assert debts.collect(T0 + 3000) == [], "what is collected is not owed twice"


def test_a_tenant_that_kept_to_its_rate_through_a_long_outage_owes_no_more_than_its_bucket() -> (
    None
):
    """Ten minutes at one request a second from a 60-a-minute bucket: Redis, full after the
    outage, is charged down to the local bucket's level, not 600 requests into debt (which
    would refuse the tenant for ten minutes after Redis is back)."""
    local = LocalBuckets()
    debts = LocalDebts(local)
    one, whole = bucket("b", 60, 0.001, 1), bucket("b", 60, 0.001, 0)
    local.seed("b", 30, 60, 0.001, T0)
    for second in range(600):
        debts.track(one, whole, T0 + second * 1000)
        assert local.take([one], None, T0 + second * 1000).allowed
    now = T0 + 600_000
    redis = LocalBuckets()  # Redis's bucket: it stood at 30 too, and refilled since
    redis.seed("b", 30, 60, 0.001, T0)
    redis.adjust(debts.collect(now), None, now)
    assert refilled_level(redis, one, now) == pytest.approx(refilled_level(local, one, now))
    assert refilled_level(redis, one, now) == pytest.approx(30)


def test_a_refund_after_the_take_was_collected_is_owed_back() -> None:
    local = LocalBuckets()
    debts = LocalDebts(local)
    take, whole = bucket("tok", 1000, 0, 300), bucket("tok", 1000, 0, 0)
    debts.track(take, whole, T0)
    assert local.take([take], None, T0).allowed
    assert [c.cost for c in debts.collect(T0)] == [300]
    local.adjust(bucket("tok", 1000, 0, -200), None, T0 + 5)  # settled: 100 used
    assert [c.cost for c in debts.collect(T0 + 5)] == [-200]


def test_charges_restored_after_a_failure_stay_owed_after_tracking_stops() -> None:
    local = LocalBuckets()
    debts = LocalDebts(local)
    take, whole = bucket("tok", 100, 0, 40), bucket("tok", 200, 0, 0)
    debts.track(take, whole, T0)
    assert local.take([take], None, T0).allowed
    collected = debts.collect(T0)
    debts.restore(collected)  # the call failed: Redis may not have it
    debts.stop_tracking()
    assert len(debts) == 1
    assert [(c.key, c.capacity, c.cost) for c in debts.collect(T0 + 1)] == [("tok", 200, 40)]
    assert debts.collect(T0 + 2) == []
    assert len(debts) == 0


# Each step: ms passed, then a take of `cost`, or a charge or refund of `cost` to the
# gateway's last request admitted (as a stream's charge or a settle would; never more
# refunded than it was charged).
debt_steps = st.lists(
    st.tuples(
        st.integers(0, 3000),
        st.sampled_from(["take", "charge", "refund"]),
        st.floats(0, 30, allow_nan=False),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(
    capacity=st.floats(1, 100, allow_nan=False),
    rate=st.floats(0, 0.05, allow_nan=False),
    start=st.floats(0, 1, allow_nan=False),
    replicas=st.integers(1, 3),
    steps=debt_steps,
    gap=st.integers(0, 100_000),
)
def test_charging_the_debts_leaves_redis_where_the_local_buckets_ended(
    capacity: float,
    rate: float,
    start: float,
    replicas: int,
    steps: list[tuple[int, str, float]],
    gap: int,
) -> None:
    """However the outage went, Redis (untouched during it, then charged what each gateway
    owes) ends at the sum of the gateways' local buckets: the limit and the refill, never
    the refill twice."""
    level0 = start * capacity
    redis = LocalBuckets()
    redis.seed("b", level0, capacity, rate, T0)
    whole = bucket("b", capacity, rate, 0)
    share = bucket("b", capacity / replicas, rate / replicas, 0)
    gateways = []
    for _ in range(replicas):
        local = LocalBuckets()
        local.seed("b", level0 / replicas, share.capacity, share.refill_per_ms, T0)
        gateways.append((local, LocalDebts(local)))
    now = T0 + gap  # the outage starts a while after Redis's last answer
    admitted = [0.0] * replicas  # each gateway's last admitted request's tokens, if any
    for i, (ms, action, cost) in enumerate(steps):
        now += ms
        g = i % replicas
        local, debts = gateways[g]
        spec = bucket("b", share.capacity, share.refill_per_ms, cost)
        if action == "take":
            debts.track(spec, whole, now)
            admitted[g] = cost if local.take([spec], None, now).allowed else 0.0
        elif action == "charge" and admitted[g]:
            local.adjust(spec, None, now)
            admitted[g] += cost
        elif action == "refund" and admitted[g]:
            refund = min(cost, admitted[g])
            local.adjust(bucket("b", share.capacity, share.refill_per_ms, -refund), None, now)
            admitted[g] -= refund
    now += 1
    for _, debts in gateways:
        charges = debts.collect(now)
        if charges:
            redis.adjust(charges, None, now)
    ended = sum(refilled_level(local, share, now) for local, _ in gateways)
    tolerance = 1e-9 * (capacity + abs(ended) + 1) * (len(steps) + 1)
    assert refilled_level(redis, whole, now) == pytest.approx(ended, abs=tolerance)
