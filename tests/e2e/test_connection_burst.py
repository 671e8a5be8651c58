"""A burst of honest clients from one address is served while a slow-loris from the same
address is cut off (issue 39: 300 streams from one host got 172 connection resets).

One gateway with the shipped connection limits but a short head timeout and a smaller
slow cap. From one address, 1,000 connections at once, each sending a streamed chat
request as soon as it is open, and beside them a slow-loris (connections that send
their head a byte at a time; with the burst, 1,020 connections, under the 1,024 allowed
from one address); from another address, keyed requests all along. Every burst request
ends with a response the client can read: 200, or a 429/503 with Retry-After from the
limits and queues (the admission queue sheds what one model cannot take); none with a
reset, and none refused for being a new connection.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections import Counter
from collections.abc import Iterator

import pytest
from aiohttp import web

from tests.e2e.stack import KEYS, Gateway, default_tenants, model, start_gateway
from tests.e2e.upstreams import chat_upstream, serve_in_thread

BURST = 1_000
SLOW_LORIS = 20
MAX_SLOW = 12
HEAD_TIMEOUT_S = 3.0
BURST_FROM = "127.0.0.20"
OTHER = "127.0.0.21"
# A hang guard only, far above what the gateway should take.
GUARD_S = 120.0


async def stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await response.prepare(request)
    chunk = {
        "id": "x",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}],
    }
    await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    await response.write(b"data: [DONE]\n\n")
    return response


@pytest.fixture(scope="module")
def gateway(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with serve_in_thread([chat_upstream(stream)]) as urls:
        tenants = default_tenants(["echo"])  # no rate limits: the connections are tested
        started = start_gateway(
            tmp_path_factory.mktemp("burst"),
            {"echo": model("openai", urls)},
            redis_url,
            tenants=tenants,
            gateway={
                "server": {
                    "head_timeout_s": HEAD_TIMEOUT_S,
                    "slow_head_grace_s": 1.0,
                    "max_slow_connections_per_address": MAX_SLOW,
                }
            },
        )
        try:
            yield started
        finally:
            started.process.terminate()
            started.process.wait(10)


def address(gateway: Gateway) -> tuple[str, int]:
    host, port = gateway.url.removeprefix("http://").split(":")
    return host, int(port)


Outcome = tuple[int, str, str]  # status, Retry-After ('' when none), error code


async def streamed_chat(
    connection: tuple[asyncio.StreamReader, asyncio.StreamWriter], key: str
) -> Outcome | str:
    """A streamed chat request on an open connection, or the name of the error that
    ended it (a reset: no response to read)."""
    body = json.dumps(
        {"model": "echo", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    ).encode()
    return await exchange(
        connection,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Authorization: Bearer " + key.encode() + b"\r\nContent-Type: application/json"
        b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body,
    )


async def models(connection: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> Outcome | str:
    """`GET /v1/models` with a key: served past every queue, by the connection layer."""
    return await exchange(
        connection,
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Authorization: Bearer " + KEYS["globex"].encode() + b"\r\n\r\n",
    )


async def exchange(
    connection: tuple[asyncio.StreamReader, asyncio.StreamWriter], request: bytes
) -> Outcome | str:
    reader, writer = connection
    try:
        writer.write(request)
        await writer.drain()
        reply = await asyncio.wait_for(reader.read(), GUARD_S)
    except OSError as exc:
        return type(exc).__name__
    finally:
        writer.close()
    raw_head, _, raw_body = reply.partition(b"\r\n\r\n")
    head = raw_head.decode("latin-1").split("\r\n")
    if not head[0].startswith("HTTP/1.1 "):
        return "no response"
    status = int(head[0].split(" ")[1])
    retry_after = next(
        (line.split(":", 1)[1].strip() for line in head if line.lower().startswith("retry-after:")),
        "",
    )
    code = json.loads(raw_body)["error"]["code"] if status >= 400 else ""
    return status, retry_after, code


def slow_loris(gateway: Gateway, stop: threading.Event, closed: list[bytes]) -> None:
    """Connections from BURST_FROM sending a head a byte at a time until closed."""
    host, port = address(gateway)
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * 4096
    socks = [
        socket.create_connection((host, port), source_address=(BURST_FROM, 0))
        for _ in range(SLOW_LORIS)
    ]
    for sock in socks:
        sock.setblocking(False)
    for byte in head:
        if stop.wait(0.1) or not socks:
            break
        for sock in list(socks):
            try:
                sock.send(bytes([byte]))
                reply = sock.recv(65536)  # the gateway's answer, then its close
            except BlockingIOError:
                continue
            except OSError:
                reply = b"reset"
            closed.append(reply)
            socks.remove(sock)
            sock.close()
    for sock in socks:
        sock.close()


async def test_a_thousand_honest_connections_from_one_address_are_all_answered(
    gateway: Gateway,
) -> None:
    host, port = address(gateway)
    stop, closed_loris = threading.Event(), []
    loris = threading.Thread(target=slow_loris, args=(gateway, stop, closed_loris))
    loris.start()
    try:
        # All at once, each sending its request as soon as it is open: a burst as a
        # Locust machine or a NAT makes it (new connections were counted like a
        # slow-loris's until their head was read).
        async def one() -> Outcome | str:
            try:
                opened = await asyncio.open_connection(host, port, local_addr=(BURST_FROM, 0))
            except OSError as exc:
                return type(exc).__name__
            return await streamed_chat(opened, KEYS["acme"])

        outcomes = asyncio.gather(*(one() for _ in range(BURST)))
        others = []
        while not outcomes.done():  # another address, served all along
            other = await asyncio.open_connection(host, port, local_addr=(OTHER, 0))
            others.append(await models(other))
        done = await outcomes
        statuses = Counter(o[0] if isinstance(o, tuple) else o for o in done)
        loris.join(GUARD_S)  # cut off meanwhile, or within the head timeout
    finally:
        stop.set()
        loris.join(GUARD_S)

    assert set(statuses) <= {200, 429, 503}, statuses  # no reset, no other error
    refusals = [o for o in done if isinstance(o, tuple) and o[0] != 200]
    assert all(retry_after for _, retry_after, _ in refusals)
    # None refused for opening a connection: only the limits and the queues refuse.
    assert not [code for *_, code in refusals if code.startswith("too_many_connections")], Counter(
        code for *_, code in refusals
    )
    assert statuses[200] > 0, statuses
    assert others and all(isinstance(o, tuple) and o[0] == 200 for o in others), others
    assert len(closed_loris) == SLOW_LORIS
    # Past the slow cap at the grace (429), the rest at the head timeout (408).
    assert sorted(reply[:12] for reply in closed_loris) == sorted(
        [b"HTTP/1.1 408"] * MAX_SLOW + [b"HTTP/1.1 429"] * (SLOW_LORIS - MAX_SLOW)
    ), closed_loris
