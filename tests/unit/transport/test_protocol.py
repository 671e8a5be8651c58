"""The caps per client address on slow connections, readable refusals, trusted proxies
and the PROXY protocol, on real sockets: uvicorn serving a stand-in app with
`GuardedHttpToolsProtocol`.

The stand-in answers as the gateway's routes do: its `/v1/` routes check the key first
(401 without a good one), probes answer anyone, unknown paths are 404; `/whoami` says
which client address the request has. Every client runs on loopback, from addresses of
127.0.0.0/8 chosen per test.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Iterator

import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from gateway.config.schema import ServerConfig
from gateway.transport import protocol
from gateway.transport.protocol import GuardedHttpToolsProtocol, _address_key

CAP = 3
GRACE_S = 0.3
LIMITS = {
    "max_slow_connections_per_address": CAP,
    "slow_head_grace_s": GRACE_S,
    "head_timeout_s": 8.0,
    "trusted_proxies": ["127.0.0.8", "127.0.0.9"],
}
GOOD_KEY = b"Bearer sk-good"
# How long a test waits for the server to act: a hang guard only.
GUARD_S = 10.0


# Answers of `/v1/slow` wait for this: a model still thinking about its first token.
slow_answers = asyncio.Event()
slow_requests: asyncio.Queue[None] = asyncio.Queue()  # one per `/v1/slow` request taken


async def stand_in(scope: Scope, receive: Receive, send: Send) -> None:
    """`/v1/models` and `/v1/slow`: 401 without the good key, else 200 (`/v1/slow` once
    `slow_answers` is set); `/livez`: 200; anything else: 404."""
    path = scope["path"]
    if path in ("/v1/models", "/v1/slow"):
        status = 200 if (b"authorization", GOOD_KEY) in scope["headers"] else 401
        if status == 200 and path == "/v1/slow":
            slow_requests.put_nowait(None)
            await slow_answers.wait()
    else:
        status = 200 if path in ("/livez", "/whoami") else 404
    body = b'{"ok":true}' if status == 200 else b'{"error":{}}'
    if path == "/whoami":
        body = scope["client"][0].encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture
def capped() -> Iterator[None]:
    """This worker's limits with the cap at CAP, the defaults back afterwards."""
    protocol.configure(ServerConfig(**LIMITS))
    try:
        yield
    finally:
        protocol.configure(ServerConfig())


@pytest.fixture
async def port(capped: None) -> AsyncIterator[int]:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        config = uvicorn.Config(
            stand_in,
            http=GuardedHttpToolsProtocol,
            loop="asyncio",
            lifespan="off",
            log_config=None,
            access_log=False,
        )
        server = uvicorn.Server(config)
        serving = asyncio.create_task(server.serve(sockets=[listening]))
        for _ in range(int(GUARD_S / 0.01)):
            if server.started:
                break
            await asyncio.sleep(0.01)
        try:
            yield listening.getsockname()[1]
        finally:
            server.should_exit = True
            await serving
    # Every connection has closed: none is left counted, refused ones included.
    assert protocol._slow_by_address == {}
    assert protocol._open_by_address == {}


class Client:
    """One connection from `source` (an address of 127.0.0.0/8)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int, source: str) -> Client:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
        return cls(reader, writer)

    def send(self, path: str, key: bytes | None = None) -> None:
        """Send a GET of `path` on this connection."""
        auth = b"Authorization: " + key + b"\r\n" if key else b""
        self.writer.write(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n" + auth + b"\r\n")

    async def get(self, path: str, key: bytes | None = None) -> int:
        """The status of a GET of `path` on this connection, kept alive."""
        self.send(path, key)
        return await self.status()

    async def status(self) -> int:
        """The status of the response to the request sent last."""
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), GUARD_S)
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        await self.reader.readexactly(length)
        return int(head.split(b" ")[1])

    async def refusal(self) -> bytes:
        """What the server sent before closing the connection."""
        return await asyncio.wait_for(self.reader.read(), GUARD_S)

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


async def turned_slow(address: str, count: int = CAP) -> None:
    """Wait until the server counts `count` slow connections from `address`."""
    for _ in range(int(GUARD_S / 0.02)):
        if protocol._slow_by_address.get(address, 0) >= count:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{address} has no {count} slow connections after {GUARD_S:g} s")


@contextlib.asynccontextmanager
async def clients(port: int, source: str, count: int) -> AsyncIterator[list[Client]]:
    opened = [await Client.open(port, source) for _ in range(count)]
    try:
        yield opened
    finally:
        for client in opened:
            await client.close()


async def served(port: int, source: str) -> bool:
    """Whether a new connection from `source` is served (not refused at once)."""
    client = await Client.open(port, source)
    try:
        return await client.get("/livez") == 200
    except (asyncio.IncompleteReadError, ConnectionError):
        return False
    finally:
        await client.close()


async def settled(port: int, source: str) -> None:
    """Wait until the server has seen the connections closed from `source` go."""
    for _ in range(int(GUARD_S / 0.02)):
        if await served(port, source):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{source} still refused after {GUARD_S:g} s")


async def test_a_burst_of_fast_connections_from_one_address_is_all_served(port: int) -> None:
    # Issue 39: a Locust machine or a NAT opens hundreds at once; new is not slow.
    async with clients(port, "127.0.0.2", CAP * 10) as burst:
        for client in burst:
            client.send("/v1/models", GOOD_KEY)
        assert [await client.status() for client in burst] == [200] * (CAP * 10)


async def test_slow_connections_past_the_cap_get_a_readable_429_and_others_are_served(
    port: int,
) -> None:
    async with clients(port, "127.0.0.3", CAP + 1) as idle:
        # The one that turned slow past the cap is answered and closed, the rest held.
        reads = [asyncio.ensure_future(client.reader.read()) for client in idle]
        done, held = await asyncio.wait(reads, timeout=GUARD_S, return_when="FIRST_COMPLETED")
        assert len(done) == 1
        reply = done.pop().result()
        assert reply.startswith(b"HTTP/1.1 429 ")
        assert b"retry-after: 1\r\n" in reply
        assert b'"code":"too_many_connections_from_address"' in reply
        await turned_slow("127.0.0.3")
        assert not any(read.done() for read in held)
        for read in held:
            read.cancel()
        # A fast client from the same address (a NAT), and any other, are served.
        assert await served(port, "127.0.0.3")
        assert await served(port, "127.0.0.4")


async def test_a_slow_connection_that_sends_its_request_leaves_the_count(port: int) -> None:
    async with clients(port, "127.0.0.5", CAP) as idle:
        await turned_slow("127.0.0.5")
        assert await idle[0].get("/v1/models", GOOD_KEY) == 200  # late, but whole
        async with clients(port, "127.0.0.5", 1) as (another,):
            await turned_slow("127.0.0.5")  # in the place the first one left
            assert await another.get("/v1/models", GOOD_KEY) == 200


async def test_a_refused_client_sending_its_body_reads_the_refusal(port: int) -> None:
    # Issue 39: the refusal was written and the connection closed while the client still
    # sent its body: the client got a reset (BrokenPipeError), never the 429.
    body = b"x" * 256_000
    request = b"POST /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: " + GOOD_KEY
    request += b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    protocol.configure(ServerConfig(**LIMITS, max_connections_per_address=CAP))
    async with clients(port, "127.0.0.6", CAP):
        refused = await Client.open(port, "127.0.0.6")
        refused.writer.write(request)
        await refused.writer.drain()
        reply = await refused.refusal()
        await refused.close()
    assert reply.startswith(b"HTTP/1.1 429 ")
    assert b"Too many open connections from your address" in reply
    await settled(port, "127.0.0.6")


@pytest.mark.parametrize(
    ("path", "key", "status"),
    [
        ("/v1/models", None, 401),
        ("/v1/models", b"Bearer sk-wrong", 401),
        ("/livez", None, 200),  # a probe answers anyone: it says nothing of a key
        ("/v1/unknown", GOOD_KEY, 404),
    ],
)
async def test_a_connection_without_an_accepted_key_closes_after_its_answer(
    port: int, path: str, key: bytes | None, status: int
) -> None:
    # Hostile review: a request without a key, then the connection held idle until
    # keepalive_timeout_s; 1,024 of them per address filled the worker.
    client = await Client.open(port, "127.0.0.10")
    assert await client.get(path, key) == status
    assert await client.refusal() == b""  # closed by the gateway, nothing more sent
    await client.close()


async def test_a_connection_whose_key_was_accepted_is_kept_alive(port: int) -> None:
    client = await Client.open(port, "127.0.0.10")
    for _ in range(3):
        assert await client.get("/v1/models", GOOD_KEY) == 200
    assert await client.get("/v1/models") == 401  # still its connection, now a client's
    assert await client.get("/livez") == 200
    await client.close()


async def test_a_body_answered_before_it_was_read_holds_the_connection_no_longer(
    port: int,
) -> None:
    # Hostile review: a 401 at once to a 1 MB upload without a key, then a byte of body
    # every 29 s held the connection for as long as the body lasted.
    client = await Client.open(port, "127.0.0.11")
    client.writer.write(
        b"POST /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n" + b"x" * 10
    )
    assert await client.status() == 401

    async def trickle() -> None:
        with contextlib.suppress(ConnectionError):
            for _ in range(int(GUARD_S / 0.1)):
                client.writer.write(b"x")
                await client.writer.drain()
                await asyncio.sleep(0.1)

    trickling = asyncio.create_task(trickle())
    try:
        assert await client.refusal() == b""  # closed while the body still came
    finally:
        trickling.cancel()
        await client.close()


async def test_no_cap_when_set_to_0(port: int) -> None:
    protocol.configure(ServerConfig(**{**LIMITS, "max_slow_connections_per_address": 0}))
    async with clients(port, "127.0.0.7", CAP + 2) as idle:
        # Past the grace, all still open and the address still served.
        idle[0].writer.write(b"GET /livez HTTP/1.1\r\n")  # half a head: slow, not idle
        await asyncio.sleep(GRACE_S * 2)
        assert await served(port, "127.0.0.7")


async def test_a_trusted_proxy_is_not_counted_as_one_client(port: int) -> None:
    async with clients(port, "127.0.0.8", CAP + 2) as idle:
        await asyncio.sleep(GRACE_S * 2)  # past the grace: slow, were they counted
        assert protocol._slow_by_address == {}
        assert await served(port, "127.0.0.8")
        for client in idle:
            assert await client.get("/livez") == 200


@pytest.fixture
def proxy_protocol_on(capped: None) -> Iterator[None]:
    protocol.configure(ServerConfig(**LIMITS, proxy_protocol=True))
    yield


async def proxied(port: int, header: bytes) -> Client:
    client = await Client.open(port, "127.0.0.9")
    client.writer.write(header)
    return client


def v1(source: str) -> bytes:
    return b"PROXY TCP4 " + source.encode() + b" 127.0.0.1 40000 8080\r\n"


async def test_the_proxy_protocol_names_the_client(port: int, proxy_protocol_on: None) -> None:
    client = await proxied(port, v1("203.0.113.5"))
    client.send("/whoami")
    head = await asyncio.wait_for(client.reader.readuntil(b"\r\n\r\n"), GUARD_S)
    assert head.startswith(b"HTTP/1.1 200 ")
    assert await client.reader.readexactly(len(b"203.0.113.5")) == b"203.0.113.5"
    await client.close()


async def test_slow_clients_behind_the_proxy_protocol_count_by_their_address(
    port: int, proxy_protocol_on: None
) -> None:
    slow = [await proxied(port, v1("203.0.113.6")) for _ in range(CAP)]
    try:
        await turned_slow("203.0.113.6")
        refused = await proxied(port, v1("203.0.113.6"))  # turns slow past the cap
        assert (await refused.refusal()).startswith(b"HTTP/1.1 429 ")
        await refused.close()
        other = await proxied(port, v1("203.0.113.7"))  # the balancer's other clients
        assert await other.get("/livez") == 200
        await other.close()
    finally:
        for client in slow:
            await client.close()


async def test_the_proxy_protocol_is_read_with_the_caps_off(port: int) -> None:
    # The header was read only while a per-address cap was on; with both at 0 it reached
    # the HTTP parser as a request line (400).
    no_caps = {"max_slow_connections_per_address": 0, "max_connections_per_address": 0}
    protocol.configure(ServerConfig(**{**LIMITS, **no_caps}, proxy_protocol=True))
    client = await proxied(port, v1("203.0.113.8"))
    client.send("/whoami")
    head = await asyncio.wait_for(client.reader.readuntil(b"\r\n\r\n"), GUARD_S)
    assert head.startswith(b"HTTP/1.1 200 ")
    assert await client.reader.readexactly(len(b"203.0.113.8")) == b"203.0.113.8"
    await client.close()


@pytest.mark.parametrize("start", [b"GET / HTTP/1.1\r\n\r\n", b"PROXY TCP4 nonsense\r\n"])
async def test_a_connection_without_its_proxy_header_is_refused(
    port: int, proxy_protocol_on: None, start: bytes
) -> None:
    client = await proxied(port, start)
    reply = await client.refusal()
    await client.close()
    assert reply.startswith(b"HTTP/1.1 400 ")
    assert b"PROXY protocol" in reply


@pytest.mark.parametrize(
    ("peer", "key"),
    [
        (("203.0.113.7", 5000), "203.0.113.7"),
        (("2001:db8:1:2:aaaa::1", 5000, 0, 0), "2001:0db8:0001:0002::/64"),
        (("2001:db8:1:2:bbbb::9", 5000, 0, 0), "2001:0db8:0001:0002::/64"),
        (("2001:db8:1:3::1", 5000, 0, 0), "2001:0db8:0001:0003::/64"),
        (("::ffff:198.51.100.4", 5000, 0, 0), "198.51.100.4"),  # IPv4 on a dual-stack socket
        (("fe80::1%eth0", 5000, 0, 2), "fe80:0000:0000:0000::/64"),  # link-local: no crash
        ("", None),  # a Unix socket
        (None, None),
    ],
)
def test_a_client_counts_by_its_address_or_its_ipv6_64(peer: object, key: str | None) -> None:
    assert _address_key(peer) == key
