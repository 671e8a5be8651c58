"""Per-tenant limits through real gateways, a real redis-server and real Triton."""

from __future__ import annotations

import asyncio
import email.utils
import glob
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from redis import Redis as SyncRedis
from redis.crc import key_slot

from gateway_tools.dev.processes import free_port, start_redis, stop
from gateway_tools.dev.sim.server import TritonSim
from tests import ports
from tests.e2e.stack import Gateway, model, start_gateway, tenant
from tests.polling import wait_until

HELLO = [{"role": "user", "content": "hi"}]


def key(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer sk-test-{name}"}


async def chat(
    session: aiohttp.ClientSession, gateway: Gateway, who: str, **fields: Any
) -> tuple[int, dict[str, str], dict[str, Any]]:
    body = {"model": "llm-small", "messages": HELLO, "max_tokens": 2, **fields}
    async with session.post(
        f"{gateway.base_url}/chat/completions", json=body, headers=key(who)
    ) as response:
        headers = {name.lower(): value for name, value in response.headers.items()}
        if fields.get("stream"):
            await response.read()
            return response.status, headers, {}
        return response.status, headers, await response.json()


def small_model(sims: tuple[TritonSim, TritonSim]) -> dict[str, Any]:
    return {
        "llm-small": model("triton_grpc", [sims[0].grpc_target]),
        "llm-slow": model("triton_grpc", [sims[0].grpc_target]),
    }


@pytest.fixture(scope="module")
def limited(
    sims: tuple[TritonSim, TritonSim], redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    tenants = {
        # 3 requests, refilled at one per 20 s.
        "few": tenant("few", ["*"], limits={"requests_per_minute": 3}),
        # A bucket of 80 tokens.
        "tight": tenant("tight", ["*"], limits={"tokens_per_minute": 80}),
        "pair": tenant("pair", ["*"], limits={"max_concurrent": 2}),
        # 3 requests, for the requests that ask for no inference.
        "counter": tenant("counter", ["*"], limits={"requests_per_minute": 3}),
        "reader": tenant("reader", ["*"], limits={"requests_per_minute": 3}),
        "invalid": tenant("invalid", ["*"], limits={"requests_per_minute": 3}),
        "replayer": tenant("replayer", ["*"], limits={"requests_per_minute": 3}),
        "unable": tenant("unable", ["*"], limits={"requests_per_minute": 3}),
        "watched": tenant("watched", ["*"], shadow=True, limits={"requests_per_minute": 1}),
        "roomy": tenant(
            "roomy", ["*"], limits={"requests_per_minute": 6000, "tokens_per_minute": 100000}
        ),
    }
    gw = start_gateway(
        tmp_path_factory.mktemp("limited"), small_model(sims), redis_url, tenants=tenants
    )
    try:
        yield gw
    finally:
        stop(gw.process)


async def test_every_response_carries_openai_ratelimit_headers(limited: Gateway) -> None:
    async with aiohttp.ClientSession() as session:
        status, headers, _ = await chat(session, limited, "roomy")
    assert status == 200
    assert headers["x-ratelimit-limit-requests"] == "6000"
    assert headers["x-ratelimit-limit-tokens"] == "100000"
    assert int(headers["x-ratelimit-remaining-requests"]) < 6000
    assert int(headers["x-ratelimit-remaining-tokens"]) < 100000
    assert headers["x-ratelimit-reset-requests"].endswith("s")
    assert headers["x-ratelimit-reset-tokens"].endswith("s")


async def test_request_limit_refuses_with_429_and_retry_after(limited: Gateway) -> None:
    async with aiohttp.ClientSession() as session:
        statuses = [(await chat(session, limited, "few"))[0] for _ in range(3)]
        status, headers, body = await chat(session, limited, "few")
    assert statuses == [200, 200, 200]
    assert status == 429
    assert body["error"]["type"] == "requests"
    assert body["error"]["code"] == "rate_limit_exceeded"
    assert body["error"]["param"] is None
    # One request refills in 20 s; the header rounds the exact wait up to whole seconds.
    assert 1 <= int(headers["retry-after"]) <= 20
    assert headers["x-ratelimit-remaining-requests"] == "0"
    # The SDKs show the message, not the headers: it names the limit and the same wait.
    assert body["error"]["message"] == (
        "Rate limit reached: 3 requests per minute for your organization; "
        f"retry in {headers['retry-after']} s."
    )


@pytest.mark.parametrize("who", ["counter", "reader", "invalid", "unable", "replayer"])
async def test_requests_that_ask_for_no_inference_count_against_the_request_limit(
    limited: Gateway, who: str
) -> None:
    # Attack: 300 stored-response reads in 0.2 s against 120 a minute, count_tokens
    # without any limit at all, invalid requests (740 KB of tool schemas checked each
    # time) and replays of an Idempotency-Key (310 of a 957 KB body in 10 s) charged
    # nothing.
    method = "POST"
    headers = key(who)
    body: dict[str, Any] | None
    if who == "counter":
        url = f"{limited.url}/v1/messages/count_tokens"
        body = {"model": "llm-small", "messages": HELLO}
    elif who == "reader":
        url, body, method = f"{limited.base_url}/responses/resp_unknown", None, "GET"
    elif who == "invalid":
        url = f"{limited.base_url}/chat/completions"
        body = {"model": "llm-small", "messages": HELLO, "tools": [{"type": "bogus"}]}
    elif who == "unable":  # tools for a model without them: refused after parsing
        url = f"{limited.base_url}/chat/completions"
        tools = [{"type": "function", "function": {"name": "f"}}]
        body = {"model": "llm-small", "messages": HELLO, "tools": tools}
    else:  # the first runs, the next two replay its stored answer
        url = f"{limited.base_url}/chat/completions"
        body = {"model": "llm-small", "messages": HELLO, "max_tokens": 2}
        headers = {**headers, "idempotency-key": f"replay-{time.time_ns()}"}
    async with aiohttp.ClientSession() as session:
        statuses, remaining = [], []
        for _ in range(4):
            async with session.request(method, url, json=body, headers=headers) as response:
                statuses.append(response.status)
                remaining.append(response.headers.get("x-ratelimit-remaining-requests"))
                last = await response.json()
                retry_after = response.headers.get("retry-after")
    expected = {"counter": 200, "reader": 404, "invalid": 400, "unable": 400, "replayer": 200}[who]
    assert statuses == [expected, expected, expected, 429]
    # Every counted answer says what is left, as an inference's does.
    assert remaining == ["2", "1", "0", "0"]
    assert retry_after is not None and 1 <= int(retry_after) <= 20
    # Each wire's own error shape: Anthropic's for count_tokens, OpenAI's for Responses.
    error = last["error"]
    assert error["type"] == ("rate_limit_error" if who == "counter" else "requests")


async def test_unused_reservation_is_refunded(limited: Gateway) -> None:
    async with aiohttp.ClientSession() as session:
        # Reserves the estimated prompt (13 tokens) + 30 of the 80; uses the prompt + 2.
        first, _, body = await chat(session, limited, "tight", max_tokens=30)
        assert first == 200
        used = body["usage"]["total_tokens"]
        await asyncio.sleep(0.3)  # the settle runs after the response
        second, _, _ = await chat(session, limited, "tight", max_tokens=30)
    # Without the refund the second reservation (43) would not fit in 80 - 43; with it,
    # 80 - used is left.
    assert used <= 80 - 43
    assert second == 200


async def test_request_larger_than_the_bucket_says_it_will_never_fit(limited: Gateway) -> None:
    async with aiohttp.ClientSession() as session:
        status, headers, body = await chat(session, limited, "tight", max_tokens=500)
    assert status == 429
    assert body["error"]["type"] == "tokens"
    assert "more tokens than your token limit can ever hold" in body["error"]["message"]
    assert "retry-after" not in headers
    assert headers["x-should-retry"] == "false"


async def test_concurrency_limit_holds_and_releases(limited: Gateway) -> None:
    # This prompt runs 38 tokens on the simulated models: 1.5 s on llm-slow.
    poem = [{"role": "user", "content": "write a long poem"}]
    body = {"model": "llm-slow", "messages": poem, "max_tokens": 100, "stream": True}
    url = f"{limited.base_url}/chat/completions"
    async with aiohttp.ClientSession() as session:
        # Two streams hold both slots (their first chunk has arrived) when a third comes.
        first = await session.post(url, json=body, headers=key("pair"))
        second = await session.post(url, json=body, headers=key("pair"))
        await first.content.readline()
        await second.content.readline()
        third, headers, refusal = await chat(session, limited, "pair", model="llm-slow")
        await first.read()
        await second.read()
        await asyncio.sleep(0.3)  # the leases are released after the responses
        after, _, _ = await chat(session, limited, "pair")
    assert (first.status, second.status) == (200, 200)
    assert third == 429
    assert "in flight" in refusal["error"]["message"]
    assert "retry-after" in headers
    assert after == 200


async def test_shadow_tenant_is_reported_but_not_refused(limited: Gateway) -> None:
    async with aiohttp.ClientSession() as session:
        results = [await chat(session, limited, "watched") for _ in range(3)]
        async with session.get(f"{limited.ops_url}/metrics") as response:
            exposition = await response.text()
    assert [status for status, _, _ in results] == [200, 200, 200]
    assert results[-1][1]["x-ratelimit-remaining-requests"] == "0"
    assert (
        'gateway_ratelimit_decisions_total{result="shadow_refused",tenant="watched"}' in exposition
    )


# --- several gateways, one Redis ----------------------------------------------------


def faketime_env(offset: str) -> dict[str, str]:
    """Environment that runs a process under libfaketime, `offset` from the real clock.

    Preloaded directly rather than through the `faketime` command, so the faked process
    is the gateway itself (its pid names the shared memory libfaketime makes).
    """
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    if not found:
        pytest.fail("libfaketime is not installed (scripts/bootstrap.sh installs faketime)")
    return {"LD_PRELOAD": found[0], "FAKETIME": offset, "FAKETIME_DONT_RESET": "1"}


def remove_faketime_shm(pid: int) -> None:
    """libfaketime leaves behind the shared memory it made for process `pid`."""
    for leftover in (f"faketime_shm_{pid}", f"sem.faketime_sem_{pid}"):
        Path("/dev/shm", leftover).unlink(missing_ok=True)


@pytest.mark.parametrize("skew", ["none", "+2h"])
async def test_two_gateways_share_one_bucket(
    sims: tuple[TritonSim, TritonSim], redis_url: str, tmp_path: Path, skew: str
) -> None:
    """The admitted total stays within one bucket, not one per gateway, whatever the
    gateways' clocks say: refill uses Redis server time."""
    skewed_env = None if skew == "none" else faketime_env(skew)
    burst, per_minute = 20, 60  # 20 at once, then one per second
    tenants = {
        "shared": tenant(
            "shared", ["*"], limits={"requests_per_minute": per_minute, "burst_requests": burst}
        )
    }
    prefix = {"redis": {"url": redis_url, "key_prefix": f"skew{skew}-{time.time_ns()}"}}
    a = start_gateway(tmp_path / "a", small_model(sims), redis_url, tenants=tenants, gateway=prefix)
    b = start_gateway(
        tmp_path / "b",
        small_model(sims),
        redis_url,
        tenants=tenants,
        gateway=prefix,
        env=skewed_env,
    )
    try:
        async with aiohttp.ClientSession() as session:
            started = time.monotonic()
            results = await asyncio.gather(
                *(chat(session, gw, "shared", max_tokens=1) for gw in (a, b) for _ in range(40))
            )
            elapsed = time.monotonic() - started
        async with aiohttp.ClientSession() as session, session.get(f"{b.url}/healthz") as response:
            b_clock = email.utils.parsedate_to_datetime(response.headers["date"]).timestamp()
    finally:
        stop(a.process)
        stop(b.process)
        if skewed_env is not None:
            remove_faketime_shm(b.process.pid)
    # The second gateway's clock really is off (its HTTP Date header says so).
    assert abs(b_clock - time.time()) > 3600 if skew != "none" else abs(b_clock - time.time()) < 60
    counts = Counter(status for status, _, _ in results)
    assert set(counts) <= {200, 429}
    # Never more than one bucket's worth, and never fewer than the burst that fits.
    assert burst <= counts[200] <= burst + per_minute / 60 * elapsed + 1


# --- Redis going away ---------------------------------------------------------------


@pytest.fixture
def own_redis() -> Iterator[tuple[int, list[Any]]]:
    port = free_port(start=ports.OWN_REDIS, end=ports.REDIS)
    processes = [start_redis(port)]
    try:
        yield port, processes
    finally:
        for process in processes:
            stop(process)


@pytest.mark.parametrize("mode", ["local", "open", "closed"])
async def test_redis_killed_and_restarted_under_load(
    sims: tuple[TritonSim, TritonSim],
    own_redis: tuple[int, list[Any]],
    tmp_path: Path,
    mode: str,
) -> None:
    port, processes = own_redis
    tenants = {
        "t": tenant("t", ["*"], limits={"requests_per_minute": 5}),
        "long": tenant("long", ["*"], limits={"max_concurrent": 2}),
    }
    gw = start_gateway(
        tmp_path,
        small_model(sims),
        f"redis://127.0.0.1:{port}/0",
        tenants=tenants,
        gateway={"ratelimit": {"on_redis_error": mode, "redis_retry_s": 0.2}},
    )
    try:
        async with aiohttp.ClientSession() as session:
            before = [await chat(session, gw, "t") for _ in range(6)]
            # Two streams of 40 tokens at 40 ms each, admitted by Redis, are running.
            streaming = asyncio.Event()
            running = [asyncio.create_task(_long_stream(session, gw, streaming)) for _ in range(2)]
            await streaming.wait()
            stop(processes.pop())  # Redis is gone
            during = await asyncio.gather(*(chat(session, gw, "t") for _ in range(8)))
            async with session.get(f"{gw.ops_url}/metrics") as response:
                down_metrics = await response.text()
            async with session.get(f"{gw.url}/readyz") as response:
                ready_while_down = response.status, await response.json()
            processes.append(start_redis(port))  # back, empty
            await wait_until(lambda: _redis_up(session, gw))
            async with session.get(f"{gw.url}/readyz") as response:
                ready_when_back = response.status
            after = [await chat(session, gw, "t") for _ in range(6)]
            streams = await asyncio.gather(*running)
    finally:
        stop(gw.process)
    log = (gw.config_dir / "gateway.log").read_text()
    assert f"rate limiting in {mode} mode until it is back" in log
    assert "Redis reachable again" in log
    # Without Redis, ready (degraded) while the fail mode keeps serving; not ready in
    # closed mode, where this instance refuses everything. Ready again after.
    status, body = ready_while_down
    assert status == (503 if mode == "closed" else 200)
    assert body["redis"] == {"up": False, "on_error": mode}
    assert body["status"] == ("unavailable" if mode == "closed" else "degraded")
    assert ready_when_back == 200
    # Requests in flight when Redis went away end as if nothing happened.
    assert streams == [(200, True), (200, True)]
    assert [s for s, _, _ in before] == [200] * 5 + [429]
    statuses = Counter(s for s, _, _ in during)
    if mode == "local":
        # In-process buckets that go on from Redis's last word: the tenant had used up
        # its 5 a minute, and less than one refilled since (one every 12 s).
        assert statuses == Counter({429: 8})
    elif mode == "open":
        assert statuses == Counter({200: 8})
    else:
        assert statuses == Counter({503: 8})
        assert all(h.get("retry-after") for _, h, _ in during)
        assert all(b["error"]["code"] == "rate_limiter_unavailable" for _, _, b in during)
        assert 'reason="limiter_unavailable"' in down_metrics
    assert "gateway_ratelimit_redis_up 0.0" in down_metrics
    assert f'gateway_ratelimit_fallback_decisions_total{{mode="{mode}"}}' in down_metrics
    # The restarted Redis is empty: a full bucket again, enforced in Redis.
    assert [s for s, _, _ in after] == [200] * 5 + [429]


async def _long_stream(
    session: aiohttp.ClientSession, gw: Gateway, started: asyncio.Event
) -> tuple[int, bool]:
    """Stream 40 tokens of llm-slow; set `started` at the first chunk. Returns the status
    and whether the stream ended with `data: [DONE]`."""
    body = {"model": "llm-slow", "messages": HELLO, "max_tokens": 40, "stream": True}
    async with session.post(
        f"{gw.base_url}/chat/completions", json=body, headers=key("long")
    ) as response:
        last = b""
        async for line in response.content:
            started.set()
            if line.strip():
                last = line.strip()
        return response.status, last == b"data: [DONE]"


async def _redis_up(session: aiohttp.ClientSession, gw: Gateway) -> bool:
    async with session.get(f"{gw.ops_url}/metrics") as response:
        return "gateway_ratelimit_redis_up 1.0" in await response.text()


# --- other Redis deployments --------------------------------------------------------


@pytest.mark.parametrize("deployment", ["cluster", "embedded"])
async def test_limits_hold_on_redis_cluster_and_embedded_fakeredis(
    sims: tuple[TritonSim, TritonSim],
    tmp_path: Path,
    request: pytest.FixtureRequest,
    deployment: str,
) -> None:
    if deployment == "cluster":
        ports: list[int] = request.getfixturevalue("redis_cluster")
        redis = {"url": f"redis://127.0.0.1:{ports[0]}/0", "cluster": True}
    else:
        redis = {"url": "embedded://"}
    tenants = {
        name: tenant(name, ["*"], limits={"requests_per_minute": 2, "max_concurrent": 4})
        for name in ("north", "south", "east")  # spread over the cluster's slots
    }
    gw = start_gateway(
        tmp_path, small_model(sims), redis["url"], tenants=tenants, gateway={"redis": redis}
    )
    try:
        async with aiohttp.ClientSession() as session:
            results = {
                name: [(await chat(session, gw, name))[0] for _ in range(3)] for name in tenants
            }
            async with session.get(f"{gw.ops_url}/metrics") as response:
                exposition = await response.text()
    finally:
        stop(gw.process)
    assert results == {name: [200, 200, 429] for name in tenants}
    assert "gateway_ratelimit_redis_up 1.0" in exposition


async def test_four_gateways_on_a_redis_cluster_admit_no_tenant_past_its_bound(
    sims: tuple[TritonSim, TritonSim], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Issue 16: four gateway processes, two of them with two workers (six processes
    deciding), share a three-primary Redis Cluster; several tenants, their keys on
    different primaries, each sent far more than its bound through every gateway at once.
    Each tenant's admitted total stays within its one bucket."""
    ports: list[int] = request.getfixturevalue("redis_cluster")
    redis = {"url": f"redis://127.0.0.1:{ports[0]}/0", "cluster": True,
             "key_prefix": f"scale-{time.time_ns()}"}  # fmt: skip
    burst, per_minute = 12, 60
    names = ("north", "south", "east", "west", "centre")
    tenants = {
        name: tenant(name, ["*"], limits={"requests_per_minute": per_minute,
                                          "burst_requests": burst})
        for name in names
    }  # fmt: skip
    gateways = []
    try:
        for i, workers in enumerate((2, 2, 1, 1)):
            gateways.append(
                start_gateway(tmp_path / f"g{i}", small_model(sims), redis["url"],
                              tenants=tenants, gateway={"redis": redis}, workers=workers)
            )  # fmt: skip
        async with aiohttp.ClientSession() as session:
            started = time.monotonic()
            results = await asyncio.gather(
                *(
                    chat(session, gw, name, max_tokens=1)
                    for gw in gateways
                    for name in names
                    for _ in range(10)
                )
            )
            elapsed = time.monotonic() - started
    finally:
        for gw in gateways:
            stop(gw.process)
    admitted: Counter[str] = Counter()
    statuses = Counter(status for status, _, _ in results)
    assert set(statuses) <= {200, 429}, statuses
    per_request = [name for _ in gateways for name in names for _ in range(10)]
    for name, (status, _, _) in zip(per_request, results, strict=True):
        admitted[name] += status == 200
    bound = burst + per_minute / 60 * elapsed + 1
    print(f"four gateways on a Redis Cluster: {len(results)} requests in {elapsed:.2f} s, "
          f"admitted per tenant {dict(admitted)}, bound {bound:.1f}")  # fmt: skip
    for name in names:
        assert burst <= admitted[name] <= bound, (name, admitted[name], bound)
    # The tenants' buckets live on every one of the three primaries.
    with SyncRedis(port=ports[0]) as node:
        ranges = node.execute_command("CLUSTER SLOTS")
    owners = {
        name: next(port for start, end, (_, port, *_), *_ in ranges
                   if start <= key_slot(f"{{{name}}}".encode()) <= end)
        for name in names
    }  # fmt: skip
    assert len(set(owners.values())) == 3, owners
