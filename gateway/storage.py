"""The Redis connection: a real server by URL, or fakeredis inside the process."""

from __future__ import annotations

from redis.asyncio import Redis

from gateway.config import GatewayConfig

EMBEDDED_URL = "embedded://"


def connect_redis(config: GatewayConfig) -> Redis:
    """A client for the configured Redis (lazy: nothing connects until first use)."""
    url = config.redis.url
    if url.startswith(EMBEDDED_URL):
        # The fallback for machines without redis-server: same commands, same Lua scripts.
        from fakeredis import FakeAsyncRedis

        client: Redis = FakeAsyncRedis()
        return client
    return Redis.from_url(
        url,
        socket_timeout=config.redis.socket_timeout_s,
        socket_connect_timeout=config.redis.socket_timeout_s,
        health_check_interval=30,
    )
