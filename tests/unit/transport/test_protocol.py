"""The cap per client address on connections without an authenticated request, on real
sockets: uvicorn serving a stand-in app with `GuardedHttpToolsProtocol`.

The stand-in answers as the gateway's routes do: its `/v1/` routes check the key first
(401 without a good one), probes answer anyone, unknown paths are 404. Every client runs
on loopback, from addresses of 127.0.0.0/8 chosen per test.
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
        status = 200 if path == "/livez" else 404
    body = b'{"ok":true}' if status == 200 else b'{"error":{}}'
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture
def capped() -> Iterator[None]:
    """This worker's limits with the cap at CAP, the defaults back afterwards."""
    protocol.configure(ServerConfig(max_unauthenticated_connections_per_address=CAP))
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
    assert protocol._unauthenticated == {}
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


async def test_one_address_beyond_the_cap_is_refused_and_others_are_served(port: int) -> None:
    async with clients(port, "127.0.0.2", CAP) as _idle:
        extra = await Client.open(port, "127.0.0.2")
        reply = await extra.refusal()
        await extra.close()
        assert reply.startswith(b"HTTP/1.1 429 ")
        assert b"retry-after: 1\r\n" in reply
        assert b'"code":"too_many_connections_from_address"' in reply
        assert await served(port, "127.0.0.3")
    await settled(port, "127.0.0.2")  # closed: the address may connect again


async def test_authenticated_connections_do_not_count(port: int) -> None:
    keyed = []
    try:
        for _ in range(CAP + 2):  # each leaves the count when its key is accepted
            keyed.append(await Client.open(port, "127.0.0.4"))
            assert await keyed[-1].get("/v1/models", GOOD_KEY) == 200
        async with clients(port, "127.0.0.4", CAP) as idle:
            assert not await served(port, "127.0.0.4")  # the idle ones fill the cap
            for client in keyed:  # the authenticated ones keep being served
                assert await client.get("/v1/models", GOOD_KEY) == 200
            # A key accepted on one of the idle ones makes room for one more.
            assert await idle[0].get("/v1/models", GOOD_KEY) == 200
            assert await served(port, "127.0.0.4")
    finally:
        for client in keyed:
            await client.close()


async def test_a_request_whose_key_was_accepted_does_not_count_while_it_waits(
    port: int,
) -> None:
    """A client that opens many connections at once, each with a request whose answer
    takes long (a model's first token), is not refused for it."""
    slow_answers.clear()
    waiting = []
    try:
        for _ in range(CAP + 2):
            waiting.append(await Client.open(port, "127.0.0.7"))
            waiting[-1].send("/v1/slow", GOOD_KEY)
            await asyncio.wait_for(slow_requests.get(), GUARD_S)  # the app has it
        async with clients(port, "127.0.0.7", CAP - 1):
            assert await served(port, "127.0.0.7")  # the last place under the cap is free
        slow_answers.set()
        for client in waiting:
            assert await client.status() == 200
    finally:
        slow_answers.set()
        for client in waiting:
            await client.close()


@pytest.mark.parametrize(
    ("path", "key", "status"),
    [
        ("/v1/models", None, 401),
        ("/v1/models", b"Bearer sk-wrong", 401),
        ("/livez", GOOD_KEY, 200),  # a probe answers anyone: it says nothing of the key
        ("/v1/unknown", GOOD_KEY, 404),
        ("/unknown", GOOD_KEY, 404),
    ],
)
async def test_a_request_without_an_accepted_key_still_counts(
    port: int, path: str, key: bytes | None, status: int
) -> None:
    async with clients(port, "127.0.0.5", CAP) as held:
        for client in held:
            assert await client.get(path, key) == status
        assert not await served(port, "127.0.0.5")
    await settled(port, "127.0.0.5")


async def test_no_cap_when_set_to_0(port: int) -> None:
    protocol.configure(ServerConfig(max_unauthenticated_connections_per_address=0))
    async with clients(port, "127.0.0.6", CAP + 2):
        assert await served(port, "127.0.0.6")


@pytest.mark.parametrize(
    ("peer", "key"),
    [
        (("203.0.113.7", 5000), "203.0.113.7"),
        (("2001:db8:1:2:aaaa::1", 5000, 0, 0), "2001:0db8:0001:0002::/64"),
        (("2001:db8:1:2:bbbb::9", 5000, 0, 0), "2001:0db8:0001:0002::/64"),
        (("2001:db8:1:3::1", 5000, 0, 0), "2001:0db8:0001:0003::/64"),
        (("::ffff:198.51.100.4", 5000, 0, 0), "198.51.100.4"),  # IPv4 on a dual-stack socket
        ("", None),  # a Unix socket
        (None, None),
    ],
)
def test_a_client_counts_by_its_address_or_its_ipv6_64(peer: object, key: str | None) -> None:
    assert _address_key(peer) == key
