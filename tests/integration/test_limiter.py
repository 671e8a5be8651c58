"""The rate limiter on a real redis-server of the test's own: lease renewal, leases of
requests past their deadline, and tenants removed by a reload. (What happens while Redis
does not answer is `test_outage.py`'s.)"""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.asyncio import Redis

from gateway.api.errors import client_error
from gateway.config import TenantsConfig
from gateway.ratelimit import limiter as limiter_module
from gateway.ratelimit.buckets import bucket_key
from gateway.ratelimit.errors import UnknownTenant
from tests.integration.own_redis import KEY_HASH, PREFIX, OwnRedis, make_limiter, tenants
from tests.polling import wait_until


async def test_a_running_request_keeps_its_lease_beyond_the_lease_ttl(
    own_redis: OwnRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Leases are short so a dead gateway's slots come back soon, and renewed while the
    request runs so a long request keeps its slot."""
    monkeypatch.setattr(limiter_module, "LEASE_TTL_S", 1.0)
    monkeypatch.setattr(limiter_module, "LEASE_RENEW_S", 0.2)
    limiter = make_limiter(own_redis.url, tenants(max_concurrent=1))
    try:
        running = await limiter.admit("t", "m", 1)
        assert running.allowed and running.reservation is not None
        await asyncio.sleep(2.5)  # well past the lease's TTL
        assert not (await limiter.admit("t", "m", 1)).allowed, "the slot is still held"
        limiter.settle(running.reservation, 1)

        async def free() -> bool:
            return (await limiter.admit("t", "m", 1)).allowed

        await wait_until(free)
    finally:
        await limiter.close()


async def test_a_request_that_asks_for_no_inference_needs_no_slot(own_redis: OwnRedis) -> None:
    """`count_tokens` beside a running stream: counted as a request, not refused by the
    tenant's one slot, and it takes none."""
    limiter = make_limiter(own_redis.url, tenants(max_concurrent=1))
    try:
        running = await limiter.admit("t", "m", 1)
        assert running.allowed and running.reservation is not None
        counting = await limiter.admit("t", "m", 0, holds_slot=False)
        assert counting.allowed
        assert counting.reservation is not None and counting.reservation.lease is None
        limiter.settle(running.reservation, 1)
        limiter.settle(counting.reservation, 0)
    finally:
        await limiter.close()


async def test_a_lease_of_a_gateway_that_stopped_renewing_expires(
    own_redis: OwnRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limiter_module, "LEASE_TTL_S", 1.0)
    crashed = make_limiter(own_redis.url, tenants(max_concurrent=1))
    other = make_limiter(own_redis.url, tenants(max_concurrent=1))
    try:
        assert (await crashed.admit("t", "m", 1)).allowed
        await crashed.close()  # stops renewing, as a gateway that died would
        assert not (await other.admit("t", "m", 1)).allowed

        async def free() -> bool:
            return (await other.admit("t", "m", 1)).allowed

        await wait_until(free)
    finally:
        await other.close()


async def test_a_tenant_removed_by_a_reload_is_refused_as_an_unknown_key(
    own_redis: OwnRedis,
) -> None:
    limiter = make_limiter(own_redis.url, tenants(requests_per_minute=10))
    try:
        limiter.update_tenants(
            TenantsConfig.model_validate({"tenants": {"other": {"api_keys": [KEY_HASH]}}})
        )
        with pytest.raises(UnknownTenant) as refused:
            await limiter.admit("t", "m", 1)
        assert client_error(refused.value).status == 401
    finally:
        await limiter.close()


async def test_tokens_are_charged_in_batches_while_streaming_and_settled_at_the_end(
    own_redis: OwnRedis,
) -> None:
    """The reservation is taken at admission; tokens beyond it are charged while the
    response streams, before it ends; the settle brings the charge to the usage."""
    limiter = make_limiter(
        own_redis.url,
        tenants(tokens_per_minute=1, burst_tokens=1000),  # refill is negligible here
        charge_batch_tokens=64,
    )
    inspect = Redis.from_url(own_redis.url)
    bucket = bucket_key(PREFIX, "t", "tokens", None)

    async def level() -> float:
        state = await inspect.get(bucket)
        assert state is not None
        return float(state.split()[0])

    async def level_is(expected: float) -> bool:
        return abs(await level() - expected) < 0.5

    try:
        admitted = await limiter.admit("t", "m", 100)
        assert admitted.allowed and admitted.reservation is not None
        assert await level_is(900)
        limiter.charge(admitted.reservation, 170)  # mid-stream, 70 beyond the reservation
        await wait_until(lambda: level_is(830))
        limiter.settle(admitted.reservation, 120)  # the response used 120: 50 come back
        await wait_until(lambda: level_is(880))
    finally:
        await limiter.close()
        await inspect.aclose()


async def test_a_lease_never_released_is_not_renewed_past_its_deadline(
    own_redis: OwnRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request that is never settled (a bug) must not hold its slot for good."""
    monkeypatch.setattr(limiter_module, "LEASE_AFTER_DEADLINE_S", 0.5)
    monkeypatch.setattr(limiter_module, "LEASE_TTL_S", 1.0)
    monkeypatch.setattr(limiter_module, "LEASE_RENEW_S", 0.2)
    limiter = make_limiter(own_redis.url, tenants(max_concurrent=1))
    try:
        forgotten = await limiter.admit("t", "m", 1, deadline=time.monotonic() + 0.5)
        assert forgotten.allowed

        async def free() -> bool:
            return (await limiter.admit("t", "m", 1)).allowed

        await wait_until(free)
    finally:
        await limiter.close()


async def test_without_redis_two_gateways_admit_no_more_than_the_refill(
    own_redis: OwnRedis,
) -> None:
    """`local` mode goes on from the last state Redis reported, each gateway with its
    share: a tenant that has used up its limit gets no fresh burst when Redis pauses."""
    per_minute, burst = 60, 10  # one request a second, ten at once
    config = tenants(requests_per_minute=per_minute, burst_requests=burst)
    gateways = [make_limiter(own_redis.url, config, gateway_replicas=2) for _ in range(2)]
    try:
        admitted = 0
        for i in range(burst + 4):  # both gateways see the bucket emptied
            admitted += (await gateways[i % 2].admit("t", "m", 1)).allowed
        assert admitted == burst
        own_redis.pause()
        paused = time.monotonic()
        during = 0
        for _ in range(20):
            for gateway in gateways:
                during += (await gateway.admit("t", "m", 1)).allowed
        assert all(not gateway.redis_up for gateway in gateways)
        elapsed = time.monotonic() - paused
        # At most what refilled since Redis paused (each gateway a half, rounded down by
        # whole requests), where a full bucket would have let through 2 x 5 at once.
        assert during <= per_minute / 60 * elapsed
    finally:
        own_redis.resume()
        for gateway in gateways:
            await gateway.close()


async def test_admissions_made_without_redis_are_charged_to_it_when_it_is_back(
    own_redis: OwnRedis,
) -> None:
    """Over an outage and the recovery after it, a tenant gets at most its bucket and the
    refill: what the gateways admitted locally while Redis was paused is charged to Redis
    when it answers again, so the bucket Redis kept does not hand out that refill twice.

    Two gateways (each enforcing half the limit without Redis) and a tenant that never
    stops asking: it empties its bucket, Redis is paused (SIGSTOP) and later resumed
    (SIGCONT), and the tenant goes on asking through both.
    """
    per_minute, burst = 120, 10  # two requests a second, ten at once
    pause_s, recovery_s = 5.0, 2.0
    config = tenants(requests_per_minute=per_minute, burst_requests=burst)
    gateways = [make_limiter(own_redis.url, config, gateway_replicas=2) for _ in range(2)]
    counts = {"before": 0, "outage": 0, "recovery": 0}

    async def ask(window: str, until: float) -> None:
        while time.monotonic() < until:
            for gateway in gateways:
                counts[window] += (await gateway.admit("t", "m", 1)).allowed
            await asyncio.sleep(0.01)

    started = time.monotonic()
    try:
        for i in range(burst + 4):  # the bucket is emptied, seen by both gateways
            counts["before"] += (await gateways[i % 2].admit("t", "m", 1)).allowed
        own_redis.pause()
        await ask("outage", time.monotonic() + pause_s)
        assert all(not gateway.redis_up for gateway in gateways)
        own_redis.resume()
        await ask("recovery", time.monotonic() + recovery_s)
        assert all(gateway.redis_up for gateway in gateways)
        elapsed = time.monotonic() - started
    finally:
        own_redis.resume()
        for gateway in gateways:
            await gateway.close()
    admitted = sum(counts.values())
    allowed = burst + per_minute / 60 * elapsed
    print(f"admitted {admitted} {counts}, allowed {allowed:.1f} over {elapsed:.2f} s")
    assert admitted <= allowed


@pytest.mark.parametrize("settled", ["without_redis", "with_redis_back"])
async def test_a_request_admitted_without_redis_is_charged_to_redis_once(
    own_redis: OwnRedis, settled: str
) -> None:
    """A request admitted locally while Redis is down reserves tokens there; when Redis is
    back it is charged the reservation, and the request's settle refunds what it did not
    use exactly once, whether it ended before Redis came back or after."""
    limiter = make_limiter(
        own_redis.url,
        tenants(tokens_per_minute=1, burst_tokens=1000),  # refill is negligible here
    )
    inspect = Redis.from_url(own_redis.url)
    bucket = bucket_key(PREFIX, "t", "tokens", None)

    async def level_is(expected: float) -> bool:
        state = await inspect.get(bucket)
        return state is not None and abs(float(state.split()[0]) - expected) < 0.5

    try:
        own_redis.kill()
        admitted = await limiter.admit("t", "m", 200)
        assert not limiter.redis_up
        assert admitted.allowed and admitted.reservation is not None
        if settled == "without_redis":
            limiter.settle(admitted.reservation, 50)
        own_redis.start_again()  # empty: the bucket is full again in Redis

        async def back() -> bool:
            return limiter.redis_up

        await wait_until(back)
        if settled == "with_redis_back":
            assert await level_is(800), "the local reservation was charged to Redis"
            limiter.charge(admitted.reservation, 300)  # streaming on: 100 more
            await wait_until(lambda: level_is(700))
            limiter.settle(admitted.reservation, 50)  # 250 come back
        await wait_until(lambda: level_is(950))
        # Nothing else is sent: it stays charged the 50 tokens used, once.
        for _ in range(3):
            assert (await limiter.admit("t", "m", 0)).allowed
        assert await level_is(950)
    finally:
        await limiter.close()
        await inspect.aclose()


async def test_spend_made_without_redis_is_charged_to_its_budget_when_redis_is_back(
    own_redis: OwnRedis,
) -> None:
    """In `local` mode a budget goes on from what Redis last reported, and what was spent
    locally (reserved, then settled to the cost) is owed to Redis and charged to the
    shared budget when it answers: the outage's spend is reconciled, not lost."""
    budget = {"amount": 1, "period": "total"}
    other = {"api_keys": ["sha256:" + "1" * 64], "limits": {"requests_per_minute": 60}}
    config = TenantsConfig.model_validate(
        {"tenants": {"t": {"api_keys": [KEY_HASH], "budgets": [budget]}, "other": other}}
    )
    limiter = make_limiter(own_redis.url, config)
    inspect = Redis.from_url(own_redis.url)
    spend = bucket_key(PREFIX, "t", "spend:total")

    async def spent() -> float:
        state = await inspect.get(spend)
        return 0.0 if state is None else 1_000_000 - float(state.split()[0])

    try:
        first = await limiter.admit("t", "m", 1, reserve_micros=300_000)
        assert first.reservation is not None
        limiter.settle(first.reservation, 1, 100_000)

        async def settled() -> bool:
            return await spent() == 100_000

        await wait_until(settled)

        own_redis.pause()
        # Another tenant's call finds Redis gone (a call sent to a paused Redis is run
        # when it resumes: the budget's own take must not be the one that finds out).
        await limiter.admit("other", "m", 1)
        during = await limiter.admit("t", "m", 1, reserve_micros=200_000)
        assert during.allowed and not limiter.redis_up
        assert during.reservation is not None and during.reservation.local
        # More than the local budget holds (what Redis last reported left, 700,000): no.
        refused = await limiter.admit("t", "m", 1, reserve_micros=600_000)
        assert refused.refused_by == "spend"
        limiter.settle(during.reservation, 1, 50_000)
        own_redis.resume()

        async def reconciled() -> bool:
            return limiter.redis_up and await spent() == 150_000

        await wait_until(reconciled)
    finally:
        own_redis.resume()
        await limiter.close()
        await inspect.aclose()
