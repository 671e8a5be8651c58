"""The Lua scripts on real Redis, Redis Cluster and fakeredis, replayed against LocalBuckets.

Every script call returns the Redis TIME it decided at; the pure-Python model, given the
same time, must reach the same decision, float for float. No assertion depends on how
long anything took in wall time, only on the server's clock.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis import Redis as SyncRedis
from redis.asyncio import RedisCluster
from redis.exceptions import RedisClusterException

from gateway.ratelimit.buckets import (
    EXPIRE_MARGIN_MS,
    BucketSpec,
    LeaseResult,
    LeaseSpec,
    LocalBuckets,
    TakeResult,
    bucket_key,
    wait_ms,
)
from gateway.ratelimit.redis_store import ADJUST_LUA, TAKE_LUA, RedisBuckets
from tests.integration.redis_backends import Backend, fresh_tenant

# -- replay against the model -----------------------------------------------------------


@dataclass(frozen=True)
class Step:
    sleep_ms: int
    kind: Literal["take", "adjust"]
    buckets: tuple[int, ...]
    amounts: tuple[float, ...]
    lease: Literal["none", "take", "release", "renew"]
    member: int


@dataclass(frozen=True)
class Scenario:
    limits: tuple[tuple[float, float], ...]
    lease_limit: int
    lease_ttl_ms: int
    steps: tuple[Step, ...]


capacities = st.one_of(st.integers(1, 50), st.floats(0.5, 100, allow_nan=False))
rates = st.one_of(
    st.sampled_from([0.0, 0.001, 0.01, 1 / 3, 1.0, 5.0]), st.floats(1e-4, 10, allow_nan=False)
)
subsets = st.lists(st.integers(0, 2), min_size=1, max_size=3, unique=True).map(tuple)
takes = st.builds(
    Step,
    sleep_ms=st.sampled_from([0, 0, 1, 3]),
    kind=st.just("take"),
    buckets=subsets,
    amounts=st.tuples(*[st.one_of(st.integers(0, 60), st.floats(0, 60))] * 3),
    lease=st.sampled_from(["none", "take", "take"]),
    member=st.integers(0, 3),
)
adjusts = st.builds(
    Step,
    sleep_ms=st.sampled_from([0, 1, 3]),
    kind=st.just("adjust"),
    buckets=st.one_of(subsets, st.just(())),
    amounts=st.tuples(*[st.one_of(st.integers(-60, 60), st.floats(-60, 60))] * 3),
    lease=st.sampled_from(["none", "release", "renew"]),
    member=st.integers(0, 3),
)
scenarios = st.builds(
    Scenario,
    limits=st.tuples(*[st.tuples(capacities, rates)] * 3),
    lease_limit=st.integers(0, 3),
    lease_ttl_ms=st.sampled_from([1, 3, 30, 10_000]),
    steps=st.lists(st.one_of(takes, takes, adjusts), min_size=1, max_size=12).map(tuple),
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(scenario=scenarios)
async def test_decisions_equal_the_model(backend: Backend, scenario: Scenario) -> None:
    tenant = fresh_tenant()
    keys = [bucket_key("it", tenant, "tokens", f"m{i}") for i in range(3)]
    lease_key = bucket_key("it", tenant, "inflight")
    model = LocalBuckets()
    for step in scenario.steps:
        if step.sleep_ms:
            await asyncio.sleep(step.sleep_ms / 1000)
        specs = [BucketSpec(keys[i], *scenario.limits[i], step.amounts[i]) for i in step.buckets]
        lease = LeaseSpec(lease_key, f"r{step.member}", scenario.lease_limit, scenario.lease_ttl_ms)
        if step.kind == "take":
            use = lease if step.lease == "take" else None
            took = await backend.store.take(specs, use)
            assert took == model.take(specs, use, took.now_ms)
        else:
            release = lease if step.lease == "release" else None
            renew = lease if step.lease == "renew" else None
            adjusted = await backend.store.adjust(specs, release, renew)
            assert adjusted == model.adjust(specs, release, adjusted.now_ms, renew)


WAIT_CASES = [
    (94.0, 97.683, 0.001),  # the rounded quotient's ceiling is one too many
    (1.6518368071287313, 18665.430691309317, 4.534445785836294),  # and one too few
    (-20.0, 1.0, 0.01),
    (0.0, 1e9, 1e-12),  # capped at 2^53 ms
    (5.0, 5.0, 1.0),
    (1.0, 2.0, 0.0),  # never
    (-1e6, 1e6, 1 / 3),
]


@pytest.mark.parametrize("script", [TAKE_LUA, ADJUST_LUA], ids=["take", "adjust"])
async def test_lua_wait_ms_equals_python(backend: Backend, script: str) -> None:
    """The scripts' wait_ms, cut out of the files and run alone, on the rounding edges."""
    # From the MAX_MS constant through the end of wait_ms (fmt, in between, is harmless).
    start = script.index("local MAX_MS")
    end = script.index("\nend\n", script.index("local function wait_ms")) + 5
    probe = (
        script[start:end]
        + "return wait_ms(tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]))"
    )
    for level, target, rate in WAIT_CASES:
        got = await backend.client.eval(probe, 0, level, target, rate)
        assert got == wait_ms(level, target, rate), (level, target, rate)


# -- the rules, one by one --------------------------------------------------------------


async def test_take_is_all_or_nothing(backend: Backend) -> None:
    tenant = fresh_tenant()
    requests = BucketSpec(bucket_key("it", tenant, "requests"), 10, 0.001, 1)
    tokens = BucketSpec(bucket_key("it", tenant, "tokens"), 100, 0.001, 101)
    lease = LeaseSpec(bucket_key("it", tenant, "inflight"), "r1", 5, 10_000)

    refused = await backend.store.take([requests, tokens], lease)
    assert not refused.allowed
    assert [b.allowed for b in refused.buckets] == [True, False]
    assert refused.buckets[0].remaining == 10  # nothing taken from the bucket that had room
    assert refused.lease == LeaseResult(True, 0)  # nor a lease

    fits = BucketSpec(tokens.key, 100, 0.001, 100)
    took = await backend.store.take([requests, fits], lease)
    assert took.allowed
    assert took.lease == LeaseResult(True, 1)
    assert took.buckets[0].remaining == 9


async def test_cost_above_capacity_never_fits(backend: Backend) -> None:
    spec = BucketSpec(bucket_key("it", fresh_tenant(), "tokens"), 50, 1.0, 51)
    result = await backend.store.take([spec])
    assert not result.allowed
    assert result.buckets[0].retry_after_ms == -1
    assert result.retry_after_ms == -1
    assert result.buckets[0].remaining == 50


async def test_lease_limit_and_expiry(backend: Backend) -> None:
    key = bucket_key("it", fresh_tenant(), "inflight")
    ttl = 50

    def lease(member: str) -> LeaseSpec:
        return LeaseSpec(key, member, 2, ttl)

    first = await backend.store.take([], lease("a"))
    assert first.lease == LeaseResult(True, 1)
    assert (await backend.store.take([], lease("b"))).lease == LeaseResult(True, 2)
    # "c" gets a slot exactly when the server's clock passes the expiry of "a".
    while True:
        result = await backend.store.take([], lease("c"))
        expired = result.now_ms >= first.now_ms + ttl
        assert result.allowed is expired
        if expired:
            break
        await asyncio.sleep(0.01)


async def test_release_and_renew(backend: Backend) -> None:
    key = bucket_key("it", fresh_tenant(), "inflight")
    a, b = LeaseSpec(key, "a", 1, 10_000), LeaseSpec(key, "b", 1, 10_000)
    assert (await backend.store.take([], a)).allowed
    assert not (await backend.store.take([], b)).allowed
    assert (await backend.store.adjust(None, renew=a)).lease_held
    assert (await backend.store.adjust(None, release=a)).lease_held
    assert not (await backend.store.adjust(None, release=a)).lease_held
    assert (await backend.store.take([], b)).lease == LeaseResult(True, 1)

    short = LeaseSpec(key, "short", 2, 1)
    took = await backend.store.take([], short)
    assert took.allowed
    expiry = took.now_ms + short.ttl_ms
    while True:
        await asyncio.sleep(0.005)
        renewed = await backend.store.adjust(None, renew=short)
        if renewed.now_ms >= expiry:
            assert not renewed.lease_held  # an expired lease is not brought back
            break
        assert renewed.lease_held
        expiry = renewed.now_ms + short.ttl_ms


async def test_adjust_refund_and_debt(backend: Backend) -> None:
    key = bucket_key("it", fresh_tenant(), "tokens")
    rate = 0.001
    model = LocalBuckets()

    async def adjust(delta: float) -> float:
        spec = BucketSpec(key, 100, rate, delta)
        result = await backend.store.adjust(spec)
        assert result == model.adjust(spec, None, result.now_ms)
        return result.remaining[0]

    took = await backend.store.take([BucketSpec(key, 100, rate, 40)])
    assert took == model.take([BucketSpec(key, 100, rate, 40)], None, took.now_ms)
    assert await adjust(-1000) == 100  # refunds stop at the capacity
    assert await adjust(130) < -29  # a debt
    need = BucketSpec(key, 100, rate, 1)
    refused = await backend.store.take([need])
    assert refused == model.take([need], None, refused.now_ms)
    assert not refused.allowed
    assert refused.buckets[0].retry_after_ms > 30 / rate


async def test_idle_keys_expire(backend: Backend) -> None:
    tenant = fresh_tenant()
    spec = BucketSpec(bucket_key("it", tenant, "tokens"), 100, 0.01, 30)
    lease = LeaseSpec(bucket_key("it", tenant, "inflight"), "r1", 5, 2000)
    result = await backend.store.take([spec], lease)
    reset = result.buckets[0].reset_ms
    assert reset == 3000
    assert 0 < await backend.client.pttl(spec.key) <= reset + EXPIRE_MARGIN_MS
    assert 0 < await backend.client.pttl(lease.key) <= 2000 + EXPIRE_MARGIN_MS
    # A bucket that never refills must never expire into a full one.
    quota = BucketSpec(bucket_key("it", tenant, "quota"), 10, 0, 1)
    assert (await backend.store.take([quota])).buckets[0].reset_ms == -1
    assert await backend.client.pttl(quota.key) == -1


async def test_scripts_reload_after_script_flush(backend: Backend) -> None:
    spec = BucketSpec(bucket_key("it", fresh_tenant(), "requests"), 5, 0.001, 1)
    assert (await backend.store.take([spec])).allowed
    await backend.client.script_flush()
    take_sha = backend.client.register_script(TAKE_LUA).sha
    adjust_sha = backend.client.register_script(ADJUST_LUA).sha
    assert await backend.client.script_exists(take_sha, adjust_sha) == [False, False]
    # NOSCRIPT: redis-py loads the script again and retries, invisibly to the caller.
    assert (await backend.store.take([spec])).buckets[0].remaining < 4
    await backend.store.adjust(spec)
    assert await backend.client.script_exists(take_sha, adjust_sha) == [True, True]


async def test_concurrent_takes_admit_exactly_the_capacity(backend: Backend) -> None:
    rate = 1e-6  # a token per 1000 s: the burst is all there is during the test
    spec = BucketSpec(bucket_key("it", fresh_tenant(), "requests"), 50, rate, 1)
    results = await asyncio.gather(*(backend.store.take([spec]) for _ in range(200)))
    admitted = sum(r.allowed for r in results)
    first, last = min(r.now_ms for r in results), max(r.now_ms for r in results)
    assert 50 <= admitted <= 50 + (last - first) * rate
    # Redis ran the calls one at a time: in server-time order they replay on the model.
    # Calls in the same microsecond have no order we can recover, so their levels may
    # differ in the last bit of a float; the decisions and waits must agree exactly.
    model = LocalBuckets()
    for result in sorted(results, key=lambda r: (r.now_ms, -r.buckets[0].remaining)):
        replayed = model.take([spec], None, result.now_ms)
        assert result.allowed == replayed.allowed
        (got,), (want,) = result.buckets, replayed.buckets
        assert (got.allowed, got.retry_after_ms, got.reset_ms) == (
            want.allowed,
            want.retry_after_ms,
            want.reset_ms,
        )
        assert got.remaining == pytest.approx(want.remaining, rel=1e-9, abs=1e-12)


# -- Redis Cluster ----------------------------------------------------------------------


@pytest.fixture
async def cluster(redis_cluster: list[int]) -> AsyncIterator[RedisCluster]:
    client = RedisCluster(host="127.0.0.1", port=redis_cluster[0])
    await client.initialize()
    yield client
    await client.aclose()


async def test_tenants_spread_over_cluster_nodes_and_each_call_works(
    cluster: RedisCluster,
) -> None:
    store = RedisBuckets(cluster)
    by_node: dict[str | int, str] = {}
    for i in range(200):
        tenant = f"spread-{uuid.uuid4().hex[:6]}-{i}"
        node = cluster.get_node_from_key(bucket_key("it", tenant, "requests"))
        assert node is not None
        by_node.setdefault(node.port, tenant)
        if len(by_node) == 3:
            break
    assert len(by_node) == 3

    for port, tenant in by_node.items():
        specs = [
            BucketSpec(bucket_key("it", tenant, "requests"), 10, 0.01, 1),
            BucketSpec(bucket_key("it", tenant, "tokens"), 1000, 1.0, 300),
            BucketSpec(bucket_key("it", tenant, "tokens", "llm-large"), 500, 1.0, 300),
        ]
        lease = LeaseSpec(bucket_key("it", tenant, "inflight"), "r1", 4, 10_000)
        result: TakeResult = await store.take(specs, lease)
        assert result.allowed
        assert (await store.adjust(specs[1:], release=lease)).lease_held
        # The keys live on the node that owns the tenant's slot.
        with SyncRedis(port=int(port)) as node_client:
            assert node_client.exists(*(s.key for s in specs)) == 3

    # Keys of two tenants in one call would span slots: redis-py refuses before sending.
    a, b = list(by_node.values())[:2]
    with pytest.raises(RedisClusterException):
        await store.take(
            [
                BucketSpec(bucket_key("it", a, "requests"), 10, 0.01, 1),
                BucketSpec(bucket_key("it", b, "requests"), 10, 0.01, 1),
            ]
        )
