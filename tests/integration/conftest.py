"""Redis backends for the bucket scripts: a single redis-server, a 3-master Redis Cluster
of the tests' own, and fakeredis with Lua. The shared Redis on 6379 is never touched."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator, Iterator

import pytest
from fakeredis import FakeAsyncRedis
from redis.asyncio import Redis, RedisCluster

from gateway.ratelimit.redis_store import RedisBuckets
from gateway.storage.redis_client import EMBEDDED_URL
from gateway_tools.dev.processes import free_port, redis_server_path, start_redis, stop
from tests import ports
from tests.integration.own_redis import OwnRedis
from tests.integration.redis_backends import Backend

BACKENDS = ["single", "cluster", "fakeredis"]
# redis-py's asyncio pools refuse a 101st concurrent command (MaxConnectionsError) by
# default; the concurrency test sends 200 at once.
MAX_CONNECTIONS = 256


@pytest.fixture(params=BACKENDS)
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    """Each test runs on a real redis-server, a real Redis Cluster and fakeredis."""
    client: Redis | RedisCluster
    if request.param == "single":
        url: str = request.getfixturevalue("redis_url")
        # Without redis-server (outside CI) the session's Redis is the embedded fakeredis.
        if url == EMBEDDED_URL:
            client = FakeAsyncRedis(max_connections=MAX_CONNECTIONS)
        else:
            client = Redis.from_url(url, max_connections=MAX_CONNECTIONS)
    elif request.param == "cluster":
        ports: list[int] = request.getfixturevalue("redis_cluster")
        client = RedisCluster(host="127.0.0.1", port=ports[0], max_connections=MAX_CONNECTIONS)
        # As the gateway does at start: redis-py's cluster client can fail a burst of
        # first commands before it has learnt the slot map.
        await client.initialize()
    else:
        client = FakeAsyncRedis(max_connections=MAX_CONNECTIONS)
    try:
        yield Backend(request.param, client, RedisBuckets(client))
    finally:
        await client.aclose()


@pytest.fixture(params=["single", "cluster", "fakeredis"])
async def client(request: pytest.FixtureRequest) -> AsyncIterator[Redis | RedisCluster]:
    """The session's redis-server (fakeredis without one), a Redis Cluster, fakeredis."""
    redis: Redis | RedisCluster
    if request.param == "single":
        url: str = request.getfixturevalue("redis_url")
        redis = FakeAsyncRedis() if url == EMBEDDED_URL else Redis.from_url(url)
    elif request.param == "cluster":
        ports: list[int] = request.getfixturevalue("redis_cluster")
        redis = RedisCluster(host="127.0.0.1", port=ports[0])
        # redis-py 8.1's async cluster client fails commands sent concurrently before its
        # first initialization ('NoneType' object has no attribute 'writelines').
        await redis.initialize()
    else:
        redis = FakeAsyncRedis()
    try:
        yield redis
    finally:
        await redis.aclose()


@pytest.fixture
def own_redis() -> Iterator[OwnRedis]:
    """A redis-server of the test's own, which it may pause, kill and start again."""
    if redis_server_path() is None:
        pytest.fail("redis-server is not installed (scripts/bootstrap.sh installs it)")
    port = free_port(start=ports.OWN_REDIS, end=ports.REDIS)
    own = OwnRedis(start_redis(port), f"redis://127.0.0.1:{port}/0")
    try:
        yield own
    finally:
        if own.process.poll() is None:
            os.kill(own.process.pid, signal.SIGCONT)
        stop(own.process)


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    """The session's redis-server (fakeredis without one)."""
    client: Redis = FakeAsyncRedis() if redis_url == EMBEDDED_URL else Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.aclose()
