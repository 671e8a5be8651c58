"""Clients that never finish, on real sockets: the gateway closes or refuses them, counts
and logs it, and keeps serving everyone else (gateway.transport.protocol)."""

from __future__ import annotations

import contextlib
import json
import select
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import pytest
from aiohttp import web
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.stack import KEYS, Gateway, default_tenants, model, start_gateway
from tests.e2e.upstreams import chat_upstream, serve_in_thread

HEAD_TIMEOUT_S = 1.0
BODY_GAP_TIMEOUT_S = 1.0
MAX_HEAD_BYTES = 4096
MAX_CONNECTIONS = 40
MAX_SLOW_PER_ADDRESS = 8
SLOW_HEAD_GRACE_S = 0.3
MAX_PER_ADDRESS = 12
# Loopback addresses of the tests' own (the gateway listens on 127.0.0.1; any address of
# 127.0.0.0/8 reaches it), so that connections other tests left closing do not count.
FLOOD = "127.0.0.2"
OTHER = "127.0.0.3"
# How long a test waits for the gateway to act: a hang guard, far above the limits.
GUARD_S = 15.0
CLOSED = "gateway_connections_closed_total"


async def answer(request: web.Request) -> web.Response:
    message = {"role": "assistant", "content": "ok"}
    choice = {"index": 0, "message": message, "finish_reason": "stop"}
    return web.json_response(
        {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [choice]}
    )


@pytest.fixture(scope="module")
def guarded(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with serve_in_thread([chat_upstream(answer)]) as urls:
        server = {
            "head_timeout_s": HEAD_TIMEOUT_S,
            "body_gap_timeout_s": BODY_GAP_TIMEOUT_S,
            "max_head_bytes": MAX_HEAD_BYTES,
            "max_connections": MAX_CONNECTIONS,
            "max_slow_connections_per_address": MAX_SLOW_PER_ADDRESS,
            "slow_head_grace_s": SLOW_HEAD_GRACE_S,
            "max_connections_per_address": MAX_PER_ADDRESS,
        }
        gateway = start_gateway(
            tmp_path_factory.mktemp("guarded"),
            {"echo": model("openai", urls)},
            redis_url,
            tenants=default_tenants(["echo"]),
            gateway={"server": server},
        )
        try:
            yield gateway
        finally:
            gateway.process.terminate()
            gateway.process.wait(10)


def connect(gateway: Gateway, source: str = "127.0.0.1") -> socket.socket:
    host, port = gateway.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=GUARD_S, source_address=(source, 0))


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the gateway sends until it closes the connection (or the guard fails)."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def served(gateway: Gateway) -> str | None:
    client = OpenAI(base_url=gateway.base_url, api_key=KEYS["acme"], max_retries=0)
    reply = client.chat.completions.create(
        model="echo", messages=[{"role": "user", "content": "hi"}]
    )
    return reply.choices[0].message.content


def closed_count(gateway: Gateway, reason: str) -> float:
    with urllib.request.urlopen(f"{gateway.ops_url}/metrics") as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == CLOSED and sample.labels == {"reason": reason}:
                return sample.value
    return 0.0


def test_a_connection_that_sends_nothing_is_closed_with_408(guarded: Gateway) -> None:
    before = closed_count(guarded, "head_timeout")
    with connect(guarded) as sock:
        reply = read_until_closed(sock)
    assert reply.startswith(b"HTTP/1.1 408 ")
    assert b'"code":"request_timeout"' in reply
    assert closed_count(guarded, "head_timeout") == before + 1
    assert "no complete request head" in guarded.log


def test_a_head_sent_a_byte_at_a_time_is_cut_off(guarded: Gateway) -> None:
    """Slow loris: each byte comes well within the deadline, the whole head never does."""
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200
    with connect(guarded) as sock:
        started = time.monotonic()
        for byte in head:
            sock.sendall(bytes([byte]))
            answered, _, _ = select.select([sock], [], [], 0.05)
            if answered or time.monotonic() - started > GUARD_S:
                break
        reply = read_until_closed(sock)
    assert reply.startswith(b"HTTP/1.1 408 ")


def test_a_body_that_stalls_is_cut_off_and_the_request_ends(guarded: Gateway) -> None:
    before = closed_count(guarded, "body_timeout")
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        b"Authorization: Bearer " + KEYS["acme"].encode() + b"\r\n"
        b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    )
    with connect(guarded) as sock:
        sock.sendall(head + b'{"model": "echo", ')
        reply = read_until_closed(sock)
    assert reply == b""  # nothing to answer: the client is the one that failed
    assert closed_count(guarded, "body_timeout") == before + 1
    assert "its request body paused" in guarded.log


@pytest.mark.parametrize("size", [MAX_HEAD_BYTES + 1, 1_000_000])
def test_a_head_over_the_cap_is_refused_with_431(guarded: Gateway, size: int) -> None:
    head = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * size + b"\r\n\r\n"
    with connect(guarded) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(head)  # may be refused before the client finished sending
        reply = read_until_closed(sock)
    assert reply.startswith(b"HTTP/1.1 431 ")
    assert b'"code":"request_header_too_large"' in reply


def test_many_headers_over_the_cap_are_refused_with_431(guarded: Gateway) -> None:
    headers = b"".join(b"X-%d: v\r\n" % i for i in range(2000))
    with connect(guarded) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
        reply = read_until_closed(sock)
    assert reply.startswith(b"HTTP/1.1 431 ")


def test_a_head_under_the_cap_is_served(guarded: Gateway) -> None:
    assert served(guarded) == "ok"
    with connect(guarded) as sock:
        sock.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\nX-Fits: " + b"a" * 3000 + b"\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")


def test_connections_beyond_the_cap_get_a_503_and_the_gateway_keeps_serving(
    guarded: Gateway,
) -> None:
    before = closed_count(guarded, "too_many_connections")
    # From several addresses, each under its own cap.
    sources = [f"127.0.0.{10 + i % 10}" for i in range(MAX_CONNECTIONS)]
    idle = [connect(guarded, source) for source in sources]
    try:
        with connect(guarded) as extra:
            reply = read_until_closed(extra)
        assert reply.startswith(b"HTTP/1.1 503 ")
        assert b"retry-after: 1" in reply
        assert b'"code":"too_many_connections"' in reply
    finally:
        for sock in idle:
            sock.close()
    # The idle ones are gone (closed by the client here; by the head deadline otherwise).
    deadline = time.monotonic() + GUARD_S
    while True:
        try:
            assert served(guarded) == "ok"
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    assert closed_count(guarded, "too_many_connections") >= before + 1
    assert f"{MAX_CONNECTIONS} open, the limit of this worker" in guarded.log


def test_a_request_in_pieces_within_the_limits_is_served(guarded: Gateway) -> None:
    body = b'{"model": "echo", "messages": [{"role": "user", "content": "hi"}]}'
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        b"Authorization: Bearer " + KEYS["acme"].encode() + b"\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    )
    with connect(guarded) as sock:
        for piece in (head[:20], head[20:], body[:10], body[10:]):
            sock.sendall(piece)
            time.sleep(HEAD_TIMEOUT_S / 4)  # pauses under each limit
        reply = sock.recv(65536)
    assert reply.startswith(b"HTTP/1.1 200 ")
    assert b'"content":"ok"' in reply


def test_every_route_that_authenticates_answers_401_without_a_key(guarded: Gateway) -> None:
    """On every path behind a key, a request without a valid one is refused with 401
    before anything else is read of it."""
    with urllib.request.urlopen(f"{guarded.url}/openapi.json") as response:
        documented = json.loads(response.read())["paths"]
    operations = [
        (method.upper(), path.replace("{response_id}", "resp_x").replace("{model}", "echo"))
        for path, methods in documented.items()
        for method in methods
        if path.startswith(("/v1/", "/admin/", "/metrics"))
    ]
    operations += [("POST", "/admin/reload"), ("GET", "/metrics")]
    assert ("POST", "/v1/chat/completions") in operations
    for method, path in operations:
        request = urllib.request.Request(f"{guarded.url}{path}", data=b"{}", method=method)
        for key in (None, "Bearer sk-wrong"):
            if key is not None:
                request.add_header("Authorization", key)
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request)
            assert refused.value.code == 401, (method, path, key)


def chat_on(sock: socket.socket) -> tuple[int, bytes]:
    """Status and body of an authenticated chat request sent on `sock`, kept alive."""
    body = b'{"model": "echo", "messages": [{"role": "user", "content": "hi"}]}'
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        b"Authorization: Bearer " + KEYS["acme"].encode() + b"\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    )
    received = b""
    while b"\r\n\r\n" not in received:
        received += sock.recv(65536)
    head, _, answer = received.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )  # fmt: skip
    while len(answer) < length:
        answer += sock.recv(65536)
    return int(head.split(b" ")[1]), answer


def test_one_address_cannot_hold_every_connection(guarded: Gateway) -> None:
    """Slow connections are capped per address: the one that turns slow past the cap
    gets a 429, the others a 408 at the head timeout; meanwhile other addresses are
    served, and so are the address's fast clients."""
    before = closed_count(guarded, "too_many_slow_from_address")
    with connect(guarded, FLOOD) as keyed:
        assert chat_on(keyed)[0] == 200  # a client of the address, before the flood
        slow = [connect(guarded, FLOOD) for _ in range(MAX_SLOW_PER_ADDRESS + 1)]
        try:
            # No head: all turn slow after the grace, one past the cap, answered first.
            select.select(slow, [], [], GUARD_S)
            with connect(guarded, OTHER) as other:
                status, answer = chat_on(other)
            assert status == 200 and b'"content":"ok"' in answer
            status, answer = chat_on(keyed)  # the same keep-alive connection
            assert status == 200 and b'"content":"ok"' in answer
            with connect(guarded, FLOOD) as fast:  # a new, fast one from the address
                assert chat_on(fast)[0] == 200
            replies = sorted(read_until_closed(sock) for sock in slow)
        finally:
            for sock in slow:
                sock.close()
    assert [reply[:12] for reply in replies] == (
        [b"HTTP/1.1 408"] * MAX_SLOW_PER_ADDRESS + [b"HTTP/1.1 429"]
    )
    assert b"retry-after: 1" in replies[-1]
    assert b'"code":"too_many_connections_from_address"' in replies[-1]
    assert closed_count(guarded, "too_many_slow_from_address") == before + 1
    assert "slow connections open from its address" in guarded.log


def test_one_tenant_cannot_hold_every_connection_with_its_key(guarded: Gateway) -> None:
    """Attack: one address opened 4,096 connections and kept them alive with keyed
    requests; everyone else got 503 while it held them. All connections from one
    address are capped too."""
    source = "127.0.0.4"
    keyed: list[socket.socket] = []
    try:
        for _ in range(MAX_PER_ADDRESS):  # each authenticated, then kept alive
            keyed.append(connect(guarded, source))
            assert chat_on(keyed[-1])[0] == 200
        with connect(guarded, source) as extra:
            reply = read_until_closed(extra)
        assert reply.startswith(b"HTTP/1.1 429 ")
        assert b"Too many open connections from your address" in reply
        assert served(guarded) == "ok"  # from 127.0.0.1
        assert chat_on(keyed[0])[0] == 200  # its own connections keep working
    finally:
        for sock in keyed:
            sock.close()

    def room_again() -> bool:
        with connect(guarded, source) as again:
            return chat_on(again)[0] == 200

    assert wait_for(room_again)  # closed connections give their place back


UPGRADE = (
    b"GET /v1/chat/completions HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
    b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    b"Sec-WebSocket-Version: 13\r\n\r\n"
)


def test_websocket_upgrades_are_plain_http_and_lock_no_address_out(guarded: Gateway) -> None:
    """Attack: 130 WebSocket upgrade requests without a key left their connections
    counted for good (the upgraded connection left the guarded protocol), and every
    later connection from the address got 429, valid key or not."""
    source = "127.0.0.5"
    for _ in range(3 * MAX_SLOW_PER_ADDRESS):
        with connect(guarded, source) as sock:
            sock.sendall(UPGRADE)
            reply = sock.recv(4096)
        assert reply.startswith(b"HTTP/1.1 405 "), reply[:60]  # plain HTTP: a GET there

    def served_from_there() -> bool:
        with connect(guarded, source) as sock:
            return chat_on(sock)[0] == 200

    assert wait_for(served_from_there)
    assert "Unsupported upgrade request" not in guarded.log


def wait_for(check: Callable[[], bool]) -> bool:
    """Whether `check()` holds within GUARD_S (the gateway closes connections a moment
    after their clients do)."""
    deadline = time.monotonic() + GUARD_S
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False
