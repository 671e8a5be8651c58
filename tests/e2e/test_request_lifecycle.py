"""Every request ends in one access-log line and one count, however it ends; a client that
leaves before its answer gives its place back at once. Real Triton, real Redis."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from gateway_tools.dev.processes import stop
from gateway_tools.dev.sim.server import TritonSim
from tests.e2e.stack import Gateway, model, start_gateway, tenant
from tests.e2e.test_rate_limits import key
from tests.e2e.upstreams import chat_upstream, serve_in_thread
from tests.polling import wait_until

MESSAGES = [{"role": "user", "content": "hi"}]


# How long the `lazy` upstream takes to its first piece: longer than the gateway takes to
# see a client leave, which the tests compare it with (an order, not a time).
LAZY_FIRST_PIECE_S = 6.0
METERED_BURST = 5_000
METERED = {False: "metered-whole", True: "metered-streamed"}
DEADLINED = "metered-deadline"


@pytest.fixture(scope="module")
def lazy_upstream() -> Iterator[tuple[str, list[bool]]]:
    """An OpenAI-style upstream that takes its time before it answers anything. With
    its URL, one flag a request it was sent, in order: set once it has answered."""
    answered: list[bool] = []

    async def answer(request: web.Request) -> web.StreamResponse:
        mine = len(answered)
        answered.append(False)
        await asyncio.sleep(LAZY_FIRST_PIECE_S)
        answered[mine] = True
        return web.json_response({"error": {"message": "too late"}}, status=503)

    with serve_in_thread([chat_upstream(answer)]) as urls:
        yield urls[0], answered


@pytest.fixture(scope="module")
def garbled_upstream() -> Iterator[str]:
    """An OpenAI-style upstream whose stream turns to garbage after its first chunk."""

    async def answer(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        delta = {"index": 0, "delta": {"content": "hi"}, "finish_reason": None}
        chunk = {"id": "x", "object": "chat.completion.chunk", "created": 0, "choices": [delta]}
        await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        await response.write(b"data: {this is not json\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response

    with serve_in_thread([chat_upstream(answer)]) as urls:
        yield urls[0]


@pytest.fixture(scope="module")
def lifecycle_gateway(
    sims: tuple[TritonSim, TritonSim],
    lazy_upstream: tuple[str, list[bool]],
    garbled_upstream: str,
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Gateway]:
    grpc = [sims[0].grpc_target]
    models = {
        # llm-slow (40 ms a token), one request at a time: the next one queues.
        "solo": model(
            "triton_grpc", grpc, upstream_model="llm-slow",
            queue={"max_queued": 8, "max_in_flight_per_replica": 1},
        ),
        # The same model over Triton's HTTP generate endpoints, for the metering tests.
        "slow-http": model(
            "triton_http", [sims[0].http_url], upstream_model="llm-slow", max_tokens_limit=4096
        ),
        "lazy": model("openai", [lazy_upstream[0]], timeouts={"first_token_s": 30}),
        "garbled": model("openai", [garbled_upstream]),
    }  # fmt: skip
    # With limits, so that answers carry x-ratelimit-* headers.
    limits = {"requests_per_minute": 100_000, "tokens_per_minute": 10_000_000}
    # A bucket of 5,000 tokens that refills one token a second: what a request is
    # charged shows in the next answer's x-ratelimit-remaining-tokens.
    metered = {"tokens_per_minute": 60, "burst_tokens": METERED_BURST}
    tenants = {
        "web": tenant("web", ["*"], priority="online", limits=limits),
        # One for each test below, so that each starts from a full bucket.
        **{
            name: tenant(name, ["slow-http"], limits=metered)
            for name in (*METERED.values(), DEADLINED)
        },
    }
    gw = start_gateway(tmp_path_factory.mktemp("lifecycle"), models, redis_url, tenants=tenants)
    try:
        yield gw
    finally:
        stop(gw.process)


async def metric(session: aiohttp.ClientSession, gw: Gateway, name: str, **labels: str) -> float:
    """The sum of the `name` samples whose labels include `labels`."""
    wanted = [f'{label}="{value}"' for label, value in labels.items()]
    total = 0.0
    async with session.get(f"{gw.ops_url}/metrics") as response:
        for line in (await response.text()).splitlines():
            if line.startswith(name + "{") and all(w in line for w in wanted):
                total += float(line.split()[-1])
    return total


def raw_request(gw: Gateway, body: dict[str, Any], headers: dict[str, str]) -> bytes:
    payload = orjson.dumps(body)
    host = gw.url.removeprefix("http://")
    head = [
        "POST /v1/chat/completions HTTP/1.1",
        f"host: {host}",
        "content-type: application/json",
        f"content-length: {len(payload)}",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + payload


async def send_and_leave_later(
    gw: Gateway, body: dict[str, Any], headers: dict[str, str]
) -> asyncio.StreamWriter:
    """Send a whole request on a connection of its own; close the writer to leave."""
    host, port = gw.url.removeprefix("http://").split(":")
    _, writer = await asyncio.open_connection(host, int(port))
    writer.write(raw_request(gw, body, headers))
    await writer.drain()
    return writer


async def post(
    session: aiohttp.ClientSession,
    gw: Gateway,
    body: dict[str, Any],
    headers: dict[str, str],
) -> tuple[int, dict[str, str], dict[str, Any]]:
    async with session.post(f"{gw.base_url}/chat/completions", json=body, headers=headers) as r:
        found = {name.lower(): value for name, value in r.headers.items()}
        return r.status, found, await r.json(content_type=None)


@pytest.mark.parametrize(
    ("who", "body", "status", "tenant_label"),
    [
        ("nobody", orjson.dumps({"model": "solo", "messages": MESSAGES}), 401, "-"),
        ("web", b'{"model": "solo", "messages": [', 400, "web"),
        ("web", orjson.dumps({"model": "no-such-model", "messages": MESSAGES}), 404, "web"),
    ],
    ids=["unknown-key", "bad-json", "unknown-model"],
)
async def test_a_refused_request_is_logged_and_counted_once(
    lifecycle_gateway: Gateway, who: str, body: bytes, status: int, tenant_label: str
) -> None:
    gw = lifecycle_gateway
    # The model label only ever takes configured names: "-" for all three.
    labels = {"tenant": tenant_label, "model": "-", "served_model": "-", "status": str(status)}
    async with aiohttp.ClientSession() as session:
        before = await metric(session, gw, "gateway_requests_total", **labels)
        async with session.post(
            f"{gw.base_url}/chat/completions",
            data=body,
            headers={**key(who), "content-type": "application/json"},
        ) as response:
            assert response.status == status
            assert set((await response.json())["error"]) == {"message", "type", "param", "code"}
            request_id = response.headers["x-request-id"]
        after = await metric(session, gw, "gateway_requests_total", **labels)
    assert after == before + 1

    async def logged() -> bool:
        return any(line["request_id"] == request_id for line in gw.access_lines())

    await wait_until(logged, timeout_s=5)
    [line] = [line for line in gw.access_lines() if line["request_id"] == request_id]
    assert (line["status"], line["tenant"], line["model"]) == (status, tenant_label, "-")
    assert "no-such-model" not in orjson.dumps(line).decode()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_client_that_leaves_while_queued_gives_its_place_back(
    lifecycle_gateway: Gateway, stream: bool
) -> None:
    gw = lifecycle_gateway
    queued = {"model": "solo", "priority": "online"}
    async with aiohttp.ClientSession() as session:

        async def queue_depth() -> float:
            return await metric(session, gw, "gateway_admission_queued", **queued)

        async def in_flight() -> float:
            return await metric(session, gw, "gateway_admission_in_flight", model="solo")

        gone = {"model": "solo", "status": "499"}
        gone_before = await metric(session, gw, "gateway_requests_total", **gone)
        seen = {line["request_id"] for line in gw.access_lines()}
        # A holds the only slot for about 4 s.
        first = {"model": "solo", "messages": MESSAGES, "max_tokens": 100}
        holder = asyncio.create_task(post(session, gw, first, key("web")))
        await wait_until(lambda: _equals(in_flight, 1))
        # B queues behind it, for a long answer (12 s), and its client leaves.
        leaving = {"model": "solo", "messages": MESSAGES, "max_tokens": 300, "stream": stream}
        writer = await send_and_leave_later(gw, leaving, key("web"))
        await wait_until(lambda: _equals(queue_depth, 1))
        writer.close()
        # Its place goes at once: while A still runs (not at A's end, nor B's deadline).
        await wait_until(lambda: _equals(queue_depth, 0))
        assert not holder.done() and await in_flight() == 1
        # So C runs next, after A: B never took the slot (its line names no model).
        after = {"model": "solo", "messages": MESSAGES, "max_tokens": 2}
        status, _, _ = await post(session, gw, after, key("web"))
        assert status == 200
        assert (await holder)[0] == 200
        gone_after = await metric(session, gw, "gateway_requests_total", **gone)
    assert gone_after == gone_before + 1
    new = [line for line in gw.access_lines() if line["request_id"] not in seen]
    assert sorted(line["status"] for line in new) == [200, 200, 499]
    [line] = [line for line in new if line["status"] == 499]
    assert (line["tenant"], line["model"], line["served_model"]) == ("web", "solo", None)
    assert line["stream"] is stream


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_client_that_leaves_while_its_answer_is_awaited_frees_the_slot(
    lifecycle_gateway: Gateway, lazy_upstream: tuple[str, list[bool]], stream: bool
) -> None:
    gw = lifecycle_gateway
    answered = lazy_upstream[1]
    async with aiohttp.ClientSession() as session:

        async def in_flight() -> float:
            return await metric(session, gw, "gateway_admission_in_flight", model="lazy")

        async def sent_upstream() -> bool:
            return len(answered) == mine + 1

        seen = {line["request_id"] for line in gw.access_lines()}
        mine = len(answered)
        body = {"model": "lazy", "messages": MESSAGES, "stream": stream}
        writer = await send_and_leave_later(gw, body, key("web"))
        await wait_until(lambda: _equals(in_flight, 1))
        await wait_until(sent_upstream)
        writer.close()
        # At once, not when the upstream answers (or the first-token timeout): the slot
        # is back while the upstream still works on it. (The wait is only a hang guard.)
        await wait_until(lambda: _equals(in_flight, 0), timeout_s=60)
        assert not answered[mine]
    [line] = [line for line in gw.access_lines() if line["request_id"] not in seen]
    assert (line["status"], line["model"], line["stream"]) == (499, "lazy", stream)


async def test_a_request_cancelled_by_its_client_frees_its_idempotency_key(
    lifecycle_gateway: Gateway,
) -> None:
    gw = lifecycle_gateway
    once = {**key("web"), "idempotency-key": f"order-{time.time_ns()}"}
    body = {"model": "solo", "messages": MESSAGES, "max_tokens": 20}
    async with aiohttp.ClientSession() as session:

        async def in_flight() -> float:
            return await metric(session, gw, "gateway_admission_in_flight", model="solo")

        await wait_until(lambda: _equals(in_flight, 0))
        writer = await send_and_leave_later(gw, body, once)
        await wait_until(lambda: _equals(in_flight, 1))  # running upstream
        writer.close()
        await wait_until(lambda: _equals(in_flight, 0))
        # At once: not a 409 until the in-progress marker expires, nor the answer the
        # cancelled request would have stored.
        status, headers, answer = await post(session, gw, body, once)
    assert status == 200, answer
    assert "idempotent-replayed" not in headers


async def test_a_request_still_queued_at_its_deadline_is_a_504_with_its_wait_and_limits(
    lifecycle_gateway: Gateway,
) -> None:
    gw = lifecycle_gateway
    waits = {"model": "solo", "priority": "online"}
    async with aiohttp.ClientSession() as session:

        async def in_flight() -> float:
            return await metric(session, gw, "gateway_admission_in_flight", model="solo")

        observed = await metric(session, gw, "gateway_queue_wait_seconds_count", **waits)
        first = {"model": "solo", "messages": MESSAGES, "max_tokens": 40}
        holder = asyncio.create_task(post(session, gw, first, key("web")))
        await wait_until(lambda: _equals(in_flight, 1))
        late = {"model": "solo", "messages": MESSAGES, "max_tokens": 5}
        status, headers, answer = await post(
            session, gw, late, {**key("web"), "x-request-timeout": "0.4"}
        )
        assert (await holder)[0] == 200
        # The holder's wait (0: it took a free slot) and the late one's.
        assert await metric(session, gw, "gateway_queue_wait_seconds_count", **waits) == (
            observed + 2
        )
    assert status == 504, answer
    assert answer["error"]["code"] == "deadline_exceeded"
    assert headers["x-ratelimit-limit-requests"] == "100000"
    [line] = [line for line in gw.access_lines() if line["request_id"] == headers["x-request-id"]]
    assert line["reason"] == "deadline"
    assert line["queue_wait_ms"] > 0  # its wait, till the deadline took it out


async def _equals(read: Any, value: float) -> bool:
    return bool(await read() == value)


async def test_a_client_that_leaves_while_sending_its_body_is_a_499_not_a_500(
    lifecycle_gateway: Gateway,
) -> None:
    gw = lifecycle_gateway
    request = raw_request(gw, {"model": "solo", "messages": MESSAGES}, key("web"))
    host, port = gw.url.removeprefix("http://").split(":")
    _, writer = await asyncio.open_connection(host, int(port))
    writer.write(request[:-10])  # the head and most of the body: the rest never comes
    await writer.drain()
    seen = {line["request_id"] for line in gw.access_lines()}
    await asyncio.sleep(0.2)  # the gateway is reading the body now
    writer.close()
    await writer.wait_closed()

    async def logged() -> bool:
        return any(line["request_id"] not in seen for line in gw.access_lines())

    await wait_until(logged)
    [line] = [line for line in gw.access_lines() if line["request_id"] not in seen]
    assert (line["status"], line["tenant"]) == (499, "web")
    assert "unhandled error" not in gw.log


async def test_a_stream_that_fails_midway_ends_with_an_error_event_and_is_logged_502(
    lifecycle_gateway: Gateway,
) -> None:
    # The upstream's stream turns to garbage: the upstream's failure (502), told in a
    # plain sentence, not the gateway's own (500) nor the parser's text.
    gw = lifecycle_gateway
    body = {"model": "garbled", "messages": MESSAGES, "stream": True}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{gw.base_url}/chat/completions", json=body, headers=key("web")) as response,
    ):
        text = await response.text()
        request_id = response.headers["x-request-id"]
    events = [line for line in text.splitlines() if line.startswith("data: ")]
    assert '"hi"' in events[0]
    assert '"error"' in events[-1] and "[DONE]" not in text
    assert "could not read" in events[-1] and "JSON" not in events[-1]
    assert gw.access_record(request_id)["status"] == 502


async def test_a_request_admitted_then_failed_upstream_records_its_queue_wait(
    lifecycle_gateway: Gateway,
) -> None:
    """Its wait in the queue (here none) counts in gateway_queue_wait_seconds like that of
    a served request: a model whose every request fails still shows its queue."""
    gw = lifecycle_gateway
    async with aiohttp.ClientSession() as session:
        before = await metric(session, gw, "gateway_queue_wait_seconds_count", model="lazy")
        status, headers, _ = await post(
            session, gw, {"model": "lazy", "messages": MESSAGES}, key("web")
        )
        record = gw.access_record(headers["x-request-id"])
        after = await metric(session, gw, "gateway_queue_wait_seconds_count", model="lazy")
    assert status == record["status"] and status >= 500
    assert record["queue_wait_ms"] is not None
    assert after == before + 1


async def sim_generated(session: aiohttp.ClientSession, sim: TritonSim, model_name: str) -> float:
    """Completion tokens the simulated replica has generated for `model_name`."""
    async with session.get(sim.metrics_url) as response:
        text = await response.text()
    wanted = f'sim_generated_tokens_total{{model="{model_name}"}}'
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(wanted))


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_client_that_leaves_pays_for_what_it_asked_and_the_replica_stops(
    lifecycle_gateway: Gateway, sims: tuple[TritonSim, TritonSim], stream: bool
) -> None:
    # Attack: ask for a long answer, leave before it comes, repeat: each was refunded in
    # full while the replica went on generating, 8x the tenant's token limit.
    gw = lifecycle_gateway
    body = {"model": "slow-http", "messages": MESSAGES, "max_tokens": 2000, "stream": stream}
    async with aiohttp.ClientSession() as session:

        async def generated() -> float:
            return await sim_generated(session, sims[0], "llm-slow")

        async def in_flight() -> float:
            return await metric(session, gw, "gateway_admission_in_flight", model="slow-http")

        await wait_until(lambda: _equals(in_flight, 0))
        before = await generated()
        writer = await send_and_leave_later(gw, body, key(METERED[stream]))
        # Gone once the replica has generated a few tokens of its answer.
        await wait_until(lambda: _more_than(generated, before + 5), timeout_s=30)
        writer.close()
        await wait_until(lambda: _equals(in_flight, 0))
        # The replica stops: it generates nothing more after the cancel has reached it.
        stopped = await _settled(generated)
        probe = {"model": "slow-http", "messages": MESSAGES, "max_tokens": 1}
        status, headers, answer = await post(session, gw, probe, key(METERED[stream]))
    assert status == 200, answer
    assert stopped - before < 2000
    remaining = int(headers["x-ratelimit-remaining-tokens"])
    if stream:
        # Metered piece by piece: the prompt and what was generated, not the 2,000 asked.
        assert METERED_BURST - 2000 < remaining < METERED_BURST - 5
    else:
        # A whole answer does not say how far the replica got: it pays its prompt and what
        # the replica can have made in the time it ran (issue 40: not all of max_tokens,
        # tests/inprocess/test_budgets.py), never nothing.
        assert remaining < METERED_BURST - 5


async def test_a_whole_answer_cut_at_the_client_s_deadline_is_paid_for(
    lifecycle_gateway: Gateway, sims: tuple[TritonSim, TritonSim]
) -> None:
    # Attack: `x-request-timeout: 4` on a long answer: a 504 after the replica had
    # generated 483 tokens, and none of them (nor the prompt) charged.
    gw = lifecycle_gateway
    body = {"model": "slow-http", "messages": MESSAGES, "max_tokens": 2000}
    # 0.2 s: under the 8 tokens (40 ms each) the model writes at the least.
    deadline = {**key(DEADLINED), "x-request-timeout": "0.2"}
    async with aiohttp.ClientSession() as session:
        status, _, answer = await post(session, gw, body, deadline)
        assert status == 504, answer
        probe = {"model": "slow-http", "messages": MESSAGES, "max_tokens": 1}
        status, headers, answer = await post(session, gw, probe, key(DEADLINED))
    assert status == 200, answer
    # Like a client that leaves: its prompt and what the replica can have made in the
    # 0.2 s it ran are paid, never nothing.
    assert int(headers["x-ratelimit-remaining-tokens"]) < METERED_BURST - 5


async def _more_than(read: Any, floor: float) -> bool:
    return await read() > floor


async def _settled(read: Any) -> float:
    """The value once it has not changed for a second (the model's token delay is 40 ms)."""
    last = await read()
    while True:
        await asyncio.sleep(1.0)
        now = await read()
        if now == last:
            return now
        last = now
