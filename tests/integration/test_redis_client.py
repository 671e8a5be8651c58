"""`eviction_policy`: what the gateway warns about at start when Redis may evict keys
(issue 40), read on a real redis-server, a Redis Cluster and fakeredis."""

from __future__ import annotations

from redis.asyncio import Redis, RedisCluster

from gateway.storage.redis_client import eviction_policy


async def test_the_policy_is_read_or_none(client: Redis | RedisCluster) -> None:
    policy = await eviction_policy(client)
    # redis-server's default (the tests' own servers keep it); fakeredis may not say.
    assert policy in ("noeviction", None)


async def test_a_redis_that_cannot_be_reached_is_none() -> None:
    unreachable = Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    try:
        assert await eviction_policy(unreachable) is None
    finally:
        await unreachable.aclose()
