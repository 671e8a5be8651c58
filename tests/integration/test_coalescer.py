"""The coalescer under `RedisBuckets`: the script calls of one moment share one pipelined
round trip on a single Redis (each goes alone on a cluster), settles need no waiting, and
flushed scripts and dropped connections are recovered unseen."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from gateway.ratelimit.buckets import BucketSpec, LeaseSpec, bucket_key
from gateway.ratelimit.coalescer import ScriptCoalescer
from gateway.ratelimit.redis_store import RedisBuckets
from gateway.storage.redis_client import EMBEDDED_URL
from tests.integration.redis_backends import Backend, fresh_tenant


async def test_settles_sent_without_waiting_take_effect(backend: Backend) -> None:
    tenants = [fresh_tenant() for _ in range(3)]  # different slots on the cluster
    settles = []
    for tenant in tenants:
        tokens = BucketSpec(bucket_key("it", tenant, "tokens"), 100, 1e-9, 60)
        lease = LeaseSpec(bucket_key("it", tenant, "inflight"), "r1", 1, 60_000)
        assert (await backend.store.take([tokens], lease)).allowed
        # The request used 10 of its 60: refund 50, and release its slot.
        settles.append(backend.store.adjust_soon([BucketSpec(tokens.key, 100, 1e-9, -50)], lease))
    await asyncio.gather(*settles)
    for tenant in tenants:
        tokens = BucketSpec(bucket_key("it", tenant, "tokens"), 100, 1e-9, 90)
        lease = LeaseSpec(bucket_key("it", tenant, "inflight"), "r2", 1, 60_000)
        again = await backend.store.take([tokens], lease)
        # 100 - 60 + 50 = 90 tokens left, and the one slot is free again.
        assert again.allowed
        assert again.buckets[0].remaining == pytest.approx(0, abs=1e-3)


async def test_calls_of_one_moment_share_a_round_trip(backend: Backend) -> None:
    round_trips: list[int] = []
    store = RedisBuckets(backend.client, observe=lambda calls, _: round_trips.append(calls))
    tenant = fresh_tenant()
    tokens = BucketSpec(bucket_key("it", tenant, "tokens"), 1000, 1e-9, 10)
    refund = BucketSpec(tokens.key, 1000, 1e-9, -10)
    # Alone, a call waits for no one. (On the cluster this also opens the connection to
    # the tenant's node: redis-py fails a burst of first commands on a new connection.)
    await store.take([tokens])
    assert round_trips == [1]
    round_trips.clear()
    takes = [asyncio.create_task(store.take([tokens])) for _ in range(20)]
    settles = [store.adjust_soon([refund]) for _ in range(5)]  # queued before takes run
    results = await asyncio.gather(*takes, *settles)
    assert all(r.allowed for r in results[:20])
    assert sum(round_trips) == 25
    if backend.name == "cluster":
        assert round_trips == [1] * 25  # redis-py sends no scripts in cluster pipelines
    else:
        assert round_trips == [25]


async def test_a_batch_reloads_flushed_scripts(backend: Backend) -> None:
    tenant = fresh_tenant()
    tokens = BucketSpec(bucket_key("it", tenant, "tokens"), 100, 1e-9, 10)
    await backend.store.take([tokens])
    await backend.client.script_flush()
    # Both scripts are gone: one batch needs both loaded again.
    _, taken = await asyncio.gather(
        backend.store.adjust_soon([BucketSpec(tokens.key, 100, 1e-9, -10)]),
        backend.store.take([BucketSpec(tokens.key, 100, 1e-9, 30)]),
    )
    assert taken.allowed
    assert taken.buckets[0].remaining == pytest.approx(70, abs=1e-3)


async def test_a_connection_redis_closed_is_replaced_unseen(redis_url: str) -> None:
    if redis_url == EMBEDDED_URL:
        pytest.skip("needs redis-server: fakeredis has no CLIENT KILL")
    client = Redis.from_url(redis_url)
    store = RedisBuckets(client)
    try:
        spec = BucketSpec(bucket_key("it", fresh_tenant(), "requests"), 10, 1e-9, 1)
        assert (await store.take([spec])).allowed
        # As after a Redis restart or an idle timeout: the server drops the connection.
        assert await client.client_kill_filter(_type="normal", skipme=True) >= 1
        again = await store.take([spec])
        assert again.allowed
        assert again.buckets[0].remaining == pytest.approx(8)  # taken once, not twice
    finally:
        await store.close()
        await client.aclose()


class _MutableProxy:
    """A TCP proxy to Redis whose replies can be held back (`mute`): a Redis that stops
    answering, on a connection that stays open."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self.mute = False
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        redis_r, redis_w = await asyncio.open_connection(*self._target)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, muted: bool) -> None:
            while data := await src.read(65536):
                if not (muted and self.mute):
                    dst.write(data)
            dst.close()

        await asyncio.gather(
            pipe(client_r, redis_w, False), pipe(redis_r, client_w, True), return_exceptions=True
        )


async def test_a_round_trip_redis_does_not_answer_times_out_and_the_next_works(
    redis_url: str,
) -> None:
    if redis_url == EMBEDDED_URL:
        pytest.skip("needs redis-server")
    target = Redis.from_url(redis_url).connection_pool.connection_kwargs
    proxy = _MutableProxy(target.get("host", "127.0.0.1"), target.get("port", 6379))
    await proxy.start()
    client = Redis(host="127.0.0.1", port=proxy.port)
    coalescer = ScriptCoalescer(client, timeout_s=0.3)
    script = client.register_script("return ARGV[1]")
    await client.script_load(script.script)
    try:
        assert await coalescer.call(script, [], ["a"]) == b"a"
        proxy.mute = True
        started = asyncio.get_running_loop().time()
        # Two round trips in a row, each timed out on its own (one timer for both).
        for _ in range(2):
            with pytest.raises(TimeoutError):
                await coalescer.call(script, [], ["b"])
        # Each waited its whole timeout: the second was not cut short by the first's timer.
        assert asyncio.get_running_loop().time() - started >= 0.6
        proxy.mute = False
        # The timed-out connection was dropped: the next call goes on a new one.
        assert await coalescer.call(script, [], ["c"]) == b"c"
        # A caller's own cancel is its own: the round trip and the others go on.
        mine = coalescer.call(script, [], ["d"])
        other = coalescer.call(script, [], ["e"])
        mine.cancel()
        assert await other == b"e"
    finally:
        await coalescer.close()
        await client.aclose()
        await proxy.close()


async def test_close_waits_for_the_calls_queued(redis_url: str) -> None:
    if redis_url == EMBEDDED_URL:
        pytest.skip("needs redis-server")  # never in CI, where redis-server is required
    client = Redis.from_url(redis_url)  # one server: the coalescer is per server
    coalescer = ScriptCoalescer(client)
    script = client.register_script("return ARGV[1]")
    await client.script_load(script.script)
    urgent = coalescer.call(script, [], ["u"])
    background = coalescer.call(script, [], ["b"], urgent=False)
    await coalescer.close()
    assert urgent.result() == b"u"
    assert background.result() == b"b"
    # Used again after close (as on another event loop), it starts its senders anew.
    assert await coalescer.call(script, [], ["again"]) == b"again"
    await coalescer.close()
    await client.aclose()
