"""The Redis connection: a real server or cluster by URL, or fakeredis inside the process."""

from __future__ import annotations

from redis.asyncio import BlockingConnectionPool, Redis, RedisCluster
from redis.exceptions import RedisError

from gateway.config import GatewayConfig

EMBEDDED_URL = "embedded://"

# What a Redis call raises when Redis cannot be reached or does not answer in time.
REDIS_ERRORS: tuple[type[BaseException], ...] = (RedisError, OSError, TimeoutError)

# Connections per Redis node. redis-py's default pool raises on the 101st concurrent
# command, which the limiter would take for an outage; this pool waits for a free
# connection instead (up to the socket timeout).
MAX_CONNECTIONS = 512

RedisClient = Redis | RedisCluster


def connect_redis(config: GatewayConfig) -> RedisClient:
    """A client for the configured Redis (lazy: nothing connects until first use)."""
    settings = config.redis
    if settings.url.startswith(EMBEDDED_URL):
        # The fallback for machines without redis-server: same commands, same Lua scripts.
        from fakeredis import FakeAsyncRedis

        client: Redis = FakeAsyncRedis()
        return client
    if settings.cluster:
        return RedisCluster.from_url(
            settings.url,
            socket_timeout=settings.socket_timeout_s,
            socket_connect_timeout=settings.socket_timeout_s,
            max_connections=MAX_CONNECTIONS,
        )
    pool = BlockingConnectionPool.from_url(
        settings.url,
        max_connections=MAX_CONNECTIONS,
        timeout=settings.socket_timeout_s,
        socket_timeout=settings.socket_timeout_s,
        socket_connect_timeout=settings.socket_timeout_s,
        health_check_interval=30,
    )
    return Redis(connection_pool=pool)
