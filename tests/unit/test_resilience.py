"""Backoff, retry budget and outlier ejection: pure logic, with a fake clock and a seeded rng."""

from __future__ import annotations

import random
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.upstream.backoff import Backoff
from gateway.upstream.budget import RetryBudget
from gateway.upstream.outlier import OutlierDetector, ReplicaState
from gateway.upstream.pool import Replica, ReplicaPool
from tests.fake_clock import FakeClock

# -- backoff ----------------------------------------------------------------------------


def test_ceiling_doubles_from_base_up_to_the_cap() -> None:
    backoff = Backoff(base_s=0.05, cap_s=1.0)
    assert [backoff.ceiling(a) for a in range(7)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    # No overflow however many attempts.
    assert backoff.ceiling(10_000) == 1.0


@given(seed=st.integers(0, 2**32), attempt=st.integers(0, 2000))
def test_delays_stay_within_zero_and_the_ceiling(seed: int, attempt: int) -> None:
    backoff = Backoff(base_s=0.05, cap_s=1.0, rng=random.Random(seed))
    assert 0.0 <= backoff.delay(attempt) <= backoff.ceiling(attempt)


def test_full_jitter_is_uniform_below_the_ceiling() -> None:
    backoff = Backoff(base_s=0.1, cap_s=10.0, rng=random.Random(7))
    ceiling = backoff.ceiling(3)  # 0.8
    samples = [backoff.delay(3) for _ in range(5000)]
    assert sum(samples) / len(samples) == pytest.approx(ceiling / 2, rel=0.03)
    # Each tenth of [0, ceiling] gets about a tenth of the draws (not "equal jitter",
    # which never goes below half the ceiling).
    counts = [0] * 10
    for s in samples:
        counts[min(9, int(s / ceiling * 10))] += 1
    assert all(400 <= c <= 600 for c in counts), counts
    assert min(samples) < ceiling * 0.01


def test_a_seeded_rng_makes_delays_reproducible() -> None:
    first = Backoff(0.05, 1.0, random.Random(42))
    second = Backoff(0.05, 1.0, random.Random(42))
    assert [first.delay(a) for a in range(10)] == [second.delay(a) for a in range(10)]


def test_backoff_rejects_bad_settings() -> None:
    with pytest.raises(ValueError):
        Backoff(base_s=-1.0, cap_s=1.0)
    with pytest.raises(ValueError):
        Backoff(base_s=0.1, cap_s=float("nan"))
    with pytest.raises(ValueError):
        Backoff(0.1, 1.0).delay(-1)


# -- retry budget -----------------------------------------------------------------------


def test_budget_allows_a_ratio_of_recent_requests() -> None:
    budget = RetryBudget(ratio=0.2, min_per_s=0.0, window_s=10.0, clock=FakeClock())
    for _ in range(100):
        budget.record_request()
    assert budget.remaining() == 20
    assert sum(budget.try_spend() for _ in range(50)) == 20
    assert budget.remaining() == 0
    # Each new request earns a fifth of a retry.
    for _ in range(5):
        budget.record_request()
    assert budget.try_spend()
    assert not budget.try_spend()


def test_budget_floor_allows_retries_without_traffic() -> None:
    budget = RetryBudget(ratio=0.2, min_per_s=1.0, window_s=10.0, clock=FakeClock())
    assert sum(budget.try_spend() for _ in range(20)) == 10
    # Fractions of a retry are not rounded up.
    budget = RetryBudget(ratio=0.1, min_per_s=0.0, window_s=10.0, clock=FakeClock())
    for _ in range(29):
        budget.record_request()
    assert sum(budget.try_spend() for _ in range(5)) == 2
    budget.record_request()
    assert budget.try_spend()


def test_budget_window_slides() -> None:
    clock = FakeClock(0.0)
    budget = RetryBudget(ratio=0.5, min_per_s=0.0, window_s=10.0, clock=clock)
    for _ in range(10):
        budget.record_request()
    assert sum(budget.try_spend() for _ in range(10)) == 5
    clock.advance(5)
    for _ in range(10):
        budget.record_request()
    # 20 requests in the window, 5 retries spent: 5 more.
    assert budget.remaining() == 5
    clock.advance(5)  # t=10: the first second's slot has left the window
    assert budget.remaining() == 5  # 10 requests, no retries left in the window
    clock.advance(5)  # t=15: everything is gone
    assert budget.remaining() == 0
    assert not budget.try_spend()
    # A long idle gap clears every slot.
    clock.advance(1000)
    budget.record_request()
    budget.record_request()
    assert budget.remaining() == 1


def test_budget_refuses_a_retry_storm() -> None:
    """Every replica failing: 1000 requests with 3 attempts each would be 2000 retries."""
    clock = FakeClock()
    budget = RetryBudget(ratio=0.2, min_per_s=1.0, window_s=10.0, clock=clock)
    retries = 0
    for i in range(1000):
        if i % 100 == 0:
            clock.advance(0.5)  # 200 requests/s for 5 s: all inside one window
        budget.record_request()
        for _ in range(2):
            if not budget.try_spend():
                break
            retries += 1
    assert retries == 200  # the ratio's share, not 2000
    assert retries <= 0.2 * 1000 + 10


def test_budget_survives_a_clock_going_back() -> None:
    clock = FakeClock(100.0)
    budget = RetryBudget(ratio=1.0, min_per_s=0.0, window_s=3.0, clock=clock)
    budget.record_request()
    clock.advance(-50)
    budget.record_request()
    assert budget.remaining() == 2


ops = st.lists(
    st.tuples(st.sampled_from(["request", "retry"]), st.floats(0, 4, allow_nan=False)),
    max_size=60,
)


@settings(max_examples=100)
@given(
    ops=ops,
    window_s=st.sampled_from([0.5, 1.0, 3.0, 7.5]),
    ratio=st.sampled_from([0.0, 0.1, 0.5, 2.0]),
    min_per_s=st.sampled_from([0.0, 0.3, 1.0]),
)
def test_budget_matches_a_list_of_timestamps(
    ops: list[tuple[str, float]], window_s: float, ratio: float, min_per_s: float
) -> None:
    """The slot ring decides as a plain list of (whole-second) timestamps would."""
    clock = FakeClock(0.0)
    budget = RetryBudget(ratio, min_per_s, window_s, clock)
    slots = max(1, -int(-window_s // 1))
    requests: deque[int] = deque()
    retries: deque[int] = deque()
    for op, gap in ops:
        clock.advance(gap)
        now_slot = int(clock.now // 1)
        for log in (requests, retries):
            while log and log[0] <= now_slot - slots:
                log.popleft()
        if op == "request":
            budget.record_request()
            requests.append(now_slot)
        else:
            allowed = len(retries) + 1 <= max(min_per_s * window_s, ratio * len(requests)) + 1e-9
            assert budget.try_spend() == allowed
            if allowed:
                retries.append(now_slot)


def test_budget_rejects_bad_settings() -> None:
    with pytest.raises(ValueError):
        RetryBudget(ratio=-0.1, min_per_s=1.0, window_s=10.0)
    with pytest.raises(ValueError):
        RetryBudget(ratio=0.2, min_per_s=1.0, window_s=0.0)


# -- outlier ejection -------------------------------------------------------------------


def detector(
    pool: ReplicaPool, clock: FakeClock, failures: int = 3, base: float = 5.0, cap: float = 60.0
) -> OutlierDetector:
    return OutlierDetector(failures, base, cap, clock, replicas=pool.replicas)


def fail(det: OutlierDetector, replica: Replica, times: int = 1) -> None:
    for _ in range(times):
        det.record_failure(replica)


def routable(pool: ReplicaPool, det: OutlierDetector) -> list[str]:
    """What a router using `available` would consider, as ReplicaPool.pick filters."""
    return [r.url for r in pool.replicas if r.healthy and det.available(r)]


def test_ejects_after_consecutive_failures_only() -> None:
    clock = FakeClock()
    pool = ReplicaPool(["a", "b"])
    a, _ = pool.replicas
    det = detector(pool, clock)
    fail(det, a, 2)
    det.record_success(a)  # breaks the run
    fail(det, a, 2)
    assert det.available(a) and det.state(a) is ReplicaState.IN_SERVICE
    fail(det, a)
    assert det.state(a) is ReplicaState.EJECTED
    assert routable(pool, det) == ["b"]
    assert det.eligible(pool.replicas) == [pool.replicas[1]]


def test_cool_down_then_a_single_half_open_probe() -> None:
    clock = FakeClock()
    pool = ReplicaPool(["a", "b"])
    a, _ = pool.replicas
    det = detector(pool, clock)
    fail(det, a, 3)
    clock.advance(4.9)
    assert not det.available(a)
    clock.advance(0.1)
    assert det.state(a) is ReplicaState.HALF_OPEN
    assert routable(pool, det) == ["a", "b"]
    with pool.lease(a):  # the probe is sent
        assert not det.available(a)
        assert routable(pool, det) == ["b"]
        det.record_success(a)
    assert det.state(a) is ReplicaState.IN_SERVICE
    assert det.available(a)


def test_a_failed_probe_doubles_the_cool_down_up_to_the_max() -> None:
    clock = FakeClock()
    pool = ReplicaPool(["a", "b"])
    a, _ = pool.replicas
    det = detector(pool, clock, base=5.0, cap=15.0)
    fail(det, a, 3)
    for cool_down in (5.0, 10.0, 15.0, 15.0):
        clock.advance(cool_down - 0.01)
        assert not det.available(a)
        clock.advance(0.01)
        assert det.available(a)
        with pool.lease(a):
            fail(det, a)  # the probe fails: ejected again, one failure is enough
        assert det.state(a) is ReplicaState.EJECTED


def test_a_success_resets_the_doubling() -> None:
    clock = FakeClock()
    pool = ReplicaPool(["a", "b"])
    a, _ = pool.replicas
    det = detector(pool, clock, base=5.0)
    fail(det, a, 3)
    clock.advance(5)
    fail(det, a)  # half-open failure: 10 s now
    clock.advance(10)
    det.record_success(a)
    assert det.state(a) is ReplicaState.IN_SERVICE
    fail(det, a, 3)
    clock.advance(5)  # back to the base cool-down
    assert det.state(a) is ReplicaState.HALF_OPEN


def test_outcomes_during_the_cool_down_change_nothing() -> None:
    clock = FakeClock()
    pool = ReplicaPool(["a", "b"])
    a, _ = pool.replicas
    det = detector(pool, clock, base=5.0)
    fail(det, a, 3)
    clock.advance(1)
    det.record_success(a)  # a request sent before the ejection
    fail(det, a, 10)
    assert det.state(a) is ReplicaState.EJECTED
    clock.advance(4)
    assert det.state(a) is ReplicaState.HALF_OPEN  # neither cut short nor extended


def test_a_probe_cancelled_without_outcome_frees_the_slot() -> None:
    clock = FakeClock()
    pool = ReplicaPool(["a", "b"])
    a, _ = pool.replicas
    det = detector(pool, clock)
    fail(det, a, 3)
    clock.advance(5)
    assert det.available(a)
    with pool.lease(a):
        assert not det.available(a)
    # The request ended (cancelled) without reporting: the next one may probe.
    assert det.available(a)
    with pool.lease(a):
        fail(det, a)
    assert det.state(a) is ReplicaState.EJECTED


def test_requests_already_in_flight_do_not_block_the_probe() -> None:
    clock = FakeClock()
    pool = ReplicaPool(["a", "b"])
    a, _ = pool.replicas
    det = detector(pool, clock)
    with pool.lease(a):  # a slow request, in flight through the whole ejection
        fail(det, a, 3)
        clock.advance(5)
        assert det.available(a)
        with pool.lease(a):
            assert not det.available(a)
        # The probe ended without outcome while the slow one still runs: still one at a time.
        assert not det.available(a)
    assert det.available(a)


def test_panic_mode_uses_the_replica_back_soonest_and_only_it() -> None:
    clock = FakeClock()
    pool = ReplicaPool(["a", "b", "c"])
    a, b, c = pool.replicas
    det = detector(pool, clock, base=5.0)
    fail(det, b, 3)
    clock.advance(1)
    fail(det, a, 3)
    # c is still in service: no ejected replica gets a request.
    assert routable(pool, det) == ["c"]
    fail(det, c, 3)
    # All ejected: b's cool-down ends first.
    assert routable(pool, det) == ["b"]
    assert det.eligible(pool.replicas) == [b]
    # A replica that fails the active check does not count as healthy, nor panic-route.
    b.healthy = False
    assert routable(pool, det) == ["a"]
    assert det.eligible(pool.replicas) == [a]
    b.healthy = True
    # As soon as a replica is back (half-open, probe slot free), panic ends.
    clock.advance(4)
    assert det.state(b) is ReplicaState.HALF_OPEN
    assert routable(pool, det) == ["b"]
    det.record_success(b)
    assert routable(pool, det) == ["b"]


def test_without_replicas_the_detector_never_panics() -> None:
    clock = FakeClock()
    pool = ReplicaPool(["a"])
    (a,) = pool.replicas
    det = OutlierDetector(1, 5.0, 60.0, clock)
    fail(det, a)
    assert not det.available(a)
    # eligible() knows its candidates, so it can.
    assert det.eligible([a]) == [a]
    a.healthy = False
    assert det.eligible([a]) == []


def test_outlier_detector_rejects_bad_settings() -> None:
    with pytest.raises(ValueError):
        OutlierDetector(0, 5.0, 60.0)
    with pytest.raises(ValueError):
        OutlierDetector(3, 10.0, 5.0)
    with pytest.raises(ValueError):
        OutlierDetector(3, 0.0, 5.0)


def test_ejection_and_return_are_reported() -> None:
    clock = FakeClock()
    pool = ReplicaPool(["a", "b"])
    a, _ = pool.replicas
    det = detector(pool, clock, failures=2, base=5.0)
    changes: list[tuple[str, float | None]] = []
    det.on_change = lambda replica: changes.append((replica.url, det.cooldown_end(replica)))
    fail(det, a)
    det.record_success(a)  # in service all along: nothing to report
    assert changes == [] and det.cooldown_end(a) is None
    fail(det, a, 2)
    assert changes == [("a", 1005.0)]
    fail(det, a)  # during the cool-down: no change
    clock.advance(5.0)
    fail(det, a)  # the half-open probe failed: ejected again, for twice as long
    assert changes[-1] == ("a", 1015.0)
    clock.advance(10.0)
    det.record_success(a)  # back in service
    assert changes[-1] == ("a", None) and len(changes) == 3
