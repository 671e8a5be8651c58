"""gateway.ratelimit.outage on a real redis-server of the test's own: a settle that
cannot reach Redis is sent when it is back, and the `local` and `closed` fallbacks."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from gateway.api.errors import client_error
from gateway.config import RedisFailureMode
from gateway.ratelimit.buckets import bucket_key
from gateway.ratelimit.errors import LimiterUnavailable
from gateway_tools.dev.processes import free_port
from tests import ports
from tests.integration.own_redis import PREFIX, OwnRedis, make_limiter, tenants
from tests.polling import wait_until


async def test_a_lease_released_while_redis_is_unreachable_is_released_when_it_is_back(
    own_redis: OwnRedis,
) -> None:
    """A settle that cannot reach Redis is kept and sent later: otherwise the tenant's
    concurrency slot stays taken until the lease expires."""
    limiter = make_limiter(own_redis.url, tenants(max_concurrent=1, tokens_per_minute=10_000))
    inspect = Redis.from_url(own_redis.url)
    inflight = bucket_key(PREFIX, "t", "inflight", None)
    try:
        first = await limiter.admit("t", "m", 100)
        assert first.allowed and first.reservation is not None
        assert await inspect.zcard(inflight) == 1

        own_redis.pause()
        limiter.settle(first.reservation, 40)  # the request ends while Redis does not answer

        async def down() -> bool:
            return not limiter.redis_up

        await wait_until(down)
        own_redis.resume()

        async def released() -> bool:
            return limiter.redis_up and await inspect.zcard(inflight) == 0

        await wait_until(released)
        second = await limiter.admit("t", "m", 100)
        assert second.allowed, "the slot of the settled request is free again"
    finally:
        await limiter.close()
        await inspect.aclose()


async def test_local_mode_refuses_for_a_while_what_only_the_whole_limit_holds() -> None:
    """In `local` mode each gateway enforces its share of a limit. A request bigger than
    the share but within the whole limit is refused with a wait, not as one that can
    never fit; one bigger than the whole limit can never fit."""
    dead = f"redis://127.0.0.1:{free_port(start=ports.OWN_REDIS, end=ports.REDIS)}/0"
    limiter = make_limiter(dead, tenants(tokens_per_minute=1000), gateway_replicas=2)
    try:
        within_whole = await limiter.admit("t", "m", 600)
        assert not within_whole.allowed
        assert not within_whole.never_fits
        assert within_whole.retry_after_s == pytest.approx(0.1)

        beyond_whole = await limiter.admit("t", "m", 1500)
        assert not beyond_whole.allowed
        assert beyond_whole.never_fits

        within_share = await limiter.admit("t", "m", 400)
        assert within_share.allowed
    finally:
        await limiter.close()


async def test_closed_mode_refuses_without_redis_except_shadow_tenants() -> None:
    dead = f"redis://127.0.0.1:{free_port(start=ports.OWN_REDIS, end=ports.REDIS)}/0"
    enforced = make_limiter(
        dead, tenants(requests_per_minute=10), on_redis_error=RedisFailureMode.CLOSED
    )
    shadow = make_limiter(
        dead,
        tenants(requests_per_minute=10, shadow=True),
        on_redis_error=RedisFailureMode.CLOSED,
    )
    try:
        with pytest.raises(LimiterUnavailable) as refused:
            await enforced.admit("t", "m", 1)
        assert client_error(refused.value).status == 503
        assert (await shadow.admit("t", "m", 1)).allowed
    finally:
        await enforced.close()
        await shadow.close()
