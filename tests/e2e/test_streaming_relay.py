"""Streams relay event by event, stop pulling from the upstream while the client does
not read, and are cut (upstream request cancelled, slot and lease released) when the
client stalls past the configured timeout or goes away."""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.stack import Gateway, model, start_gateway, tenant
from tests.e2e.test_rate_limits import key
from tests.e2e.upstreams import chat_upstream, serve_in_thread
from tests.polling import wait_for

# One SSE event of about 4 KB: the upstream sends them as fast as it may.
_CHUNK = {
    "id": "chatcmpl-endless",
    "object": "chat.completion.chunk",
    "created": 0,
    "model": "endless",
    "choices": [{"index": 0, "delta": {"content": "x" * 4000}, "finish_reason": None}],
}
EVENT = f"data: {json.dumps(_CHUNK)}\n\n".encode()
STALL_TIMEOUT_S = 1.0


@dataclass
class Upstream:
    """An upstream whose answers never end; it counts what it sent and who hung up."""

    url: str = ""
    started: int = 0
    hung_up: int = 0
    sent_bytes: int = 0


@pytest.fixture(scope="module")
def endless() -> Iterator[Upstream]:
    state = Upstream()

    async def stream(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        state.started += 1
        try:
            while True:
                # Waits while the gateway does not read: that is the backpressure.
                await response.write(EVENT)
                state.sent_bytes += len(EVENT)
        except (ConnectionError, asyncio.CancelledError):
            state.hung_up += 1
            raise

    with serve_in_thread([chat_upstream(stream)]) as (url,):
        state.url = url
        yield state


@pytest.fixture(scope="module")
def relay(
    endless: Upstream, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    gateway = start_gateway(
        tmp_path_factory.mktemp("relay"),
        {"endless": model("openai", [endless.url], timeouts={"total_s": 120.0})},
        redis_url,
        # One stream at a time: a leaked lease would refuse the next request.
        tenants={"acme": tenant("acme", ["*"], limits={"max_concurrent": 1})},
        gateway={"server": {"stream_stall_timeout_s": STALL_TIMEOUT_S}},
    )
    yield gateway
    gateway.process.terminate()
    gateway.process.wait(15)


def metric(gateway: Gateway, name: str, labels: dict[str, str]) -> float:
    with urllib.request.urlopen(f"{gateway.ops_url}/metrics") as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                return float(sample.value)
    return 0.0


def request_bytes(gateway: Gateway) -> bytes:
    body = json.dumps(
        {"model": "endless", "messages": [{"role": "user", "content": "go"}], "stream": True}
    )
    host = gateway.url.removeprefix("http://")
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: {key('acme')['authorization']}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}"
    ).encode()


def test_a_client_that_stops_reading_holds_back_the_upstream_then_is_cut_off(
    relay: Gateway, endless: Upstream
) -> None:
    host, port = relay.url.removeprefix("http://").split(":")
    cuts_before = metric(relay, "gateway_streams_cut_total", {"reason": "client_stalled"})
    hung_up_before = endless.hung_up
    with socket.socket() as client:
        # A small receive window, and the client never reads.
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect((host, int(port)))
        client.sendall(request_bytes(relay))
        wait_for(lambda: endless.hung_up > hung_up_before, "the upstream request cancelled")
    # The relay paused instead of buffering: the upstream, writing as fast as it may,
    # got only as far as the socket buffers between it and the client let it.
    assert endless.sent_bytes < 64 * 2**20
    assert metric(relay, "gateway_streams_cut_total", {"reason": "client_stalled"}) == (
        cuts_before + 1
    )
    wait_for(
        lambda: metric(relay, "gateway_admission_in_flight", {"model": "endless"}) == 0,
        "the admission slot released",
    )
    assert '"status":499' in relay.log


async def test_a_client_that_leaves_mid_stream_cancels_the_upstream_request(
    relay: Gateway, endless: Upstream
) -> None:
    hung_up_before = endless.hung_up
    started_before = endless.started
    body = {"model": "endless", "messages": [{"role": "user", "content": "go"}], "stream": True}
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{relay.base_url}/chat/completions", json=body, headers=key("acme")
        ) as response:
            assert response.status == 200
            first = await response.content.readline()
            assert first.startswith(b"data: ")
        # Leaving the block closes the connection mid-stream.
        await asyncio.to_thread(
            wait_for, lambda: endless.hung_up > hung_up_before, "the upstream request cancelled"
        )
        assert endless.started == started_before + 1
        # Its concurrency lease is back: the tenant (max 1 in flight) may stream again.
        async with session.post(
            f"{relay.base_url}/chat/completions", json=body, headers=key("acme")
        ) as again:
            assert again.status == 200
            assert (await again.content.readline()).startswith(b"data: ")
    assert metric(relay, "gateway_streams_cut_total", {"reason": "client_gone"}) >= 1
