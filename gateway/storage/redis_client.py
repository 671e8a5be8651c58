"""The Redis connection: a server or a cluster by URL, a primary that fails over (Redis
Sentinel), or fakeredis inside the process."""

from __future__ import annotations

from typing import Any

from redis.asyncio import BlockingConnectionPool, Redis, RedisCluster
from redis.asyncio.sentinel import Sentinel
from redis.connection import parse_url
from redis.exceptions import RedisError

from gateway.config import GatewayConfig
from gateway.config.schema import RedisConfig

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
    if settings.sentinel is not None:
        return _sentinel_primary(settings)
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


def _sentinel_primary(settings: RedisConfig) -> Redis:
    """A client of the primary the sentinels name. redis-py asks them again whenever a
    connection fails or the old primary answers READONLY (it was demoted), so after a
    failover the next commands go to the promoted replica."""
    assert settings.sentinel is not None
    nodes = settings.sentinel.addresses
    # The URL's database number and credentials; its host is the sentinels' business.
    parsed = parse_url(settings.url)  # type: ignore[no-untyped-call]
    options = {k: v for k, v in parsed.items() if k in ("db", "username", "password")}
    if settings.url.startswith("rediss://"):
        options["ssl"] = True  # TLS to the primary (the sentinels are asked in plain text)
    timeout = settings.socket_timeout_s
    sentinel = Sentinel(
        nodes,
        sentinel_kwargs={"socket_timeout": timeout, "socket_connect_timeout": timeout},
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
    )
    primary: Redis = sentinel.master_for(
        settings.sentinel.service, max_connections=MAX_CONNECTIONS, **options
    )
    return primary


async def eviction_policy(redis: RedisClient) -> str | None:
    """Redis's `maxmemory-policy`, or None where this client may not read it (managed
    services often refuse CONFIG) or Redis does not answer. The gateway needs
    `noeviction`: an evicting Redis could drop a managed key, a budget's spend or a
    rate-limit bucket to make room (docs/deployment.md, "Redis memory")."""
    try:
        found: Any = await redis.config_get("maxmemory-policy")
    except (RedisError, OSError, TimeoutError, NotImplementedError):
        return None
    # A cluster client may answer per node: {node: {name: value}}.
    while isinstance(found, dict) and found and "maxmemory-policy" not in found:
        found = next(iter(found.values()))
    if not isinstance(found, dict) or "maxmemory-policy" not in found:
        return None
    value = found["maxmemory-policy"]
    return value.decode() if isinstance(value, bytes) else str(value)
