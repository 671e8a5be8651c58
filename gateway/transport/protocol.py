"""uvicorn's httptools protocol with limits against clients that never finish.

uvicorn times out only idle keep-alive connections. A client that opens a connection and
sends nothing, sends its headers a byte at a time, stalls in the middle of a body, sends
a 40 MB header, or opens connections until the descriptor table is full, holds the
gateway's resources for as long as it likes. `GuardedHttpToolsProtocol` adds, per
connection:

- a head deadline: the request line and headers must arrive within `head_timeout_s` of
  the connection opening or of the request's first byte (else 408, and close);
- a body gap deadline: no pause longer than `body_gap_timeout_s` while the body arrives
  (else close; the request ends as a client that left, 499);
- a head size cap: a head over `max_head_bytes` is refused with 431 as soon as that many
  bytes are buffered, before the parser holds more;
- a connection cap per worker: beyond `max_connections` a new connection gets a 503 with
  Retry-After at once and is closed, so descriptors never run out. Connections to the
  ops listener are not capped: a flood on the API port must not hide it from Prometheus;
- a cap per client address on slow connections: a connection whose head is not
  complete `slow_head_grace_s` after it opened (or after the request's first byte) is
  slow, and counts against its address until the head completes or it closes; past
  `max_slow_connections_per_address` one turning slow is closed with a 429 (an IPv6
  client counts by its /64, which one subscriber usually holds whole). A fast client is
  never counted, however many connections it opens at once: a burst of honest clients
  from one host (a Locust machine, a NAT) is served, beside a slow-loris from the same
  address that holds at most the cap's slots past the grace, each until `head_timeout_s`
  (and all its connections within the grace stay under `max_connections_per_address`);
- a cap per client address on all its connections (`max_connections_per_address`), so
  that a tenant with a valid key cannot hold every slot either, by keeping connections
  alive with requests that cost it nothing.

A connection is kept alive between requests only once a request of its had its key
accepted (a response other than 401, 404 or 405 on a path behind a key: `/v1/`,
`/admin/`, `/metrics`, `/mcp`): a client without a key gets its answer and then the connection
closes, so it cannot hold a slot idle for `keepalive_timeout_s` after each cheap request.
And a response sent before its request's body was read (a 401 to a large upload) is
followed by the close too, once the rest has been read and dropped for up to
`_LINGER_S`, so a body trickled a byte per `body_gap_timeout_s` holds nothing. The cost
is one wrapper around a connection's requests until one is authenticated.

Every refusal can be read: the response is written, the connection half-closed, and
what the client still sends (its request, its body) read and dropped for up to
`_LINGER_S` before the close, so the client reads its 408/429/503 instead of a reset
(nginx's lingering close). At most `_MAX_LINGERING` refused connections linger at once;
past that, under a flood, they are closed at once.

Behind load balancers (`trusted_proxies`) the peer is the balancer, not a client: its
connections count against no address, unless `proxy_protocol` is on, when the PROXY
header it sends first names the client, whose address is then counted as any other.
X-Forwarded-For from a trusted proxy sets the request's client address (uvicorn's
ProxyHeadersMiddleware, configured in gateway.cli).

The gateway serves no WebSocket: an upgrade request is answered as plain HTTP on the
same guarded connection (an upgraded one would leave these counts behind).

Each is counted in `gateway_connections_closed_total{reason}` and logged (a refusal of
too many connections at most once a second, with the count since).
"""

from __future__ import annotations

import asyncio
import fcntl
import ipaddress
import logging
import resource
import sys
import termios
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from uvicorn._types import ASGIReceiveCallable, ASGISendCallable, ASGISendEvent, Scope
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.config.schema import ServerConfig
from gateway.observability import metrics
from gateway.transport import proxy_protocol
from gateway.transport.errors import APIError

log = logging.getLogger("gateway")

# Descriptors kept for everything that is not a client: upstream pools, Redis, files.
_RESERVED_FDS = 256
# How long a refused connection is read (and dropped) before it is closed.
_LINGER_S = 2.0
# Refused connections lingering at once, at most; past it they are closed at once. They
# are outside max_connections, so they come out of the descriptors kept for the rest.
_MAX_LINGERING = _RESERVED_FDS // 2


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    head_timeout_s: float
    body_gap_timeout_s: float
    max_head_bytes: int
    max_connections: int
    ops_port: int | None
    slow_head_grace_s: float = 2.0
    # 0: no cap per address.
    max_slow_per_address: int = 0
    max_per_address: int = 0
    trusted_proxies: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    proxy_protocol: bool = False


def configure(server: ServerConfig) -> ConnectionLimits:
    """Set this worker's limits from `server:` (the app factory calls it before the first
    connection); `max_connections` is kept below the descriptor limit."""
    global _limits
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    allowed = server.max_connections
    if soft != resource.RLIM_INFINITY and allowed > soft - _RESERVED_FDS:
        allowed = max(1, soft - _RESERVED_FDS)
        log.warning(
            "server.max_connections %d is above what the descriptor limit (%d) allows: %d",
            server.max_connections,
            soft,
            allowed,
        )
    _limits = _limits_of(server, allowed)
    return _limits


def _limits_of(server: ServerConfig, max_connections: int) -> ConnectionLimits:
    return ConnectionLimits(
        server.head_timeout_s,
        server.body_gap_timeout_s,
        server.max_head_bytes,
        max_connections,
        server.ops.port,
        server.slow_head_grace_s,
        server.max_slow_connections_per_address,
        server.max_connections_per_address,
        tuple(server.trusted_proxies),
        server.proxy_protocol,
    )


# Until the app configures them: the defaults of `server:` (not yet checked against the
# descriptor limit, which `configure` does once, with its warning).
_DEFAULT_SERVER = ServerConfig()
_limits = _limits_of(_DEFAULT_SERVER, _DEFAULT_SERVER.max_connections)


def _response(status: bytes, body: bytes, *extra: bytes) -> bytes:
    head = [b"HTTP/1.1 " + status, b"content-type: application/json", *extra]
    head += [b"content-length: " + str(len(body)).encode(), b"connection: close"]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def _error_body(
    status: int, message: str, code: str, type_: str = "invalid_request_error"
) -> bytes:
    # The shape every other refusal has (`APIError`), made once, at import.
    return orjson.dumps(APIError(status, message, type=type_, code=code).body())


_HEAD_TIMEOUT = _response(
    b"408 Request Timeout",
    _error_body(408, "The request head did not arrive in time.", "request_timeout"),
)
_HEAD_TOO_LARGE = _response(
    b"431 Request Header Fields Too Large",
    _error_body(431, "The request line and headers are too large.", "request_header_too_large"),
)
_NO_PROXY_HEADER = _response(
    b"400 Bad Request",
    _error_body(400, "The connection did not start with a PROXY protocol header.", "bad_proxy"),
)
_TOO_MANY = _response(
    b"503 Service Unavailable",
    _error_body(
        503, "Too many open connections; retry shortly.", "too_many_connections", "server_error"
    ),
    b"retry-after: 1",
)
_TOO_MANY_OPEN_FROM_ADDRESS = _response(
    b"429 Too Many Requests",
    _error_body(
        429,
        "Too many open connections from your address; reuse or close some, then retry.",
        "too_many_connections_from_address",
        "requests",
    ),
    b"retry-after: 1",
)
_TOO_MANY_SLOW_FROM_ADDRESS = _response(
    b"429 Too Many Requests",
    _error_body(
        429,
        "Too many connections from your address are slow to send a request; send each "
        "request whole, then retry.",
        "too_many_connections_from_address",
        "requests",
    ),
    b"retry-after: 1",
)

# Paths whose routes check the API key before anything else (see the module docstring),
# and the statuses a request without a valid key gets there.
_AUTHENTICATING_PATHS = ("/v1/", "/admin/", "/metrics", "/mcp")
_UNAUTHENTICATED_STATUSES = frozenset({401, 404, 405})

# Slow connections (see the module docstring) by address key (`_address_key`), in this
# worker; an address leaves the dict when its count drops to 0, so the dict stays as
# small as the set of addresses with slow connections open.
_slow_by_address: dict[str, int] = {}
# All open connections by address key, where `max_per_address` caps them (likewise kept
# as small as the set of addresses with connections open).
_open_by_address: dict[str, int] = {}
# Refused connections lingering now (`_MAX_LINGERING`).
_lingering = 0


class _HeadTooLarge(Exception):
    """Raised from the parser's callback to stop at a head over the cap (the parser then
    fails, and `send_400_response` sends 431 instead)."""


class _RefusalLog:
    """Logs refusals at most once a second, with the count since the last line.

    `message` takes the count, then the arguments of the refusal that logs it.
    """

    def __init__(self, message: str) -> None:
        self._message = message
        self._count = 0
        self._last = 0.0

    def refused(self, *args: object) -> None:
        self._count += 1
        now = time.monotonic()
        if now - self._last >= 1.0:
            log.warning(self._message, self._count, *args)
            self._count, self._last = 0, now


_refusals = _RefusalLog("refused %d connection(s): %d open, the limit of this worker")
_all_address_refusals = _RefusalLog(
    "refused %d connection(s) from a single address, the last from %s: %d connections "
    "open from it, the limit of this worker"
)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """`HttpToolsProtocol` with a head deadline, a body gap deadline, a head size cap,
    connection caps and readable refusals (see the module docstring)."""

    _timer: asyncio.TimerHandle | None = None
    _timer_is_head = False
    # When the head being waited for is due (its deadline, past the grace).
    _head_due = 0.0
    # What the connection waits for: a request head, the rest of a body, or nothing.
    _waiting: Literal["head", "body", "idle"] = "head"
    # Bytes received while the head was unfinished, by whole chunks.
    _head_bytes = 0
    _chunk_bytes = 0
    _too_large = False
    _refused = False
    # Whether uvicorn's own connection_made ran (a connection refused at once never joins).
    _joined = False
    _lingers = False
    # Refused: what still comes is read and dropped until the connection closes.
    _discarding = False
    # Its address's key for the per-address caps (None: not capped: the caps are off, the
    # ops listener, a Unix socket, a trusted proxy without the PROXY protocol).
    _address: str | None = None
    # Whether it counts in `_slow_by_address` now, and in `_open_by_address`.
    _slow = False
    _counted_open = False
    # Bytes from a trusted proxy before its PROXY header was whole (None: none expected).
    _proxy_prefix: bytes | None = None
    # Whether a request of its had its key accepted; until then `self.app` is `_watched`
    # around `_unwatched_app`, and the connection is not kept alive after a response.
    _authenticated = False
    _unwatched_app: Any = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        limits = _limits
        to_ops = _to_port(transport, limits.ops_port)
        if len(self.connections) >= limits.max_connections and not to_ops:
            self._refuse(transport, _TOO_MANY, "too_many_connections")
            _refusals.refused(limits.max_connections)
            return
        peer = transport.get_extra_info("peername")
        capped = limits.max_slow_per_address or limits.max_per_address
        if not to_ops:
            if _from_trusted_proxy(peer, limits):
                if limits.proxy_protocol:
                    self._proxy_prefix = b""  # the client is named by the header, caps or not
            elif capped and not self._admit(transport, _address_key(peer)):
                return
        super().connection_made(transport)
        self._joined = True
        if to_ops:
            self._authenticated = True  # the ops listener: its clients are Prometheus, ops
        else:
            self._unwatched_app, self.app = self.app, self._watched
        self._arm_head()  # also for a connection that never sends a byte

    def _admit(self, transport: asyncio.Transport, address: str | None) -> bool:
        """Count a new connection against `address`, or refuse it (False)."""
        if address is None:
            return True
        limits = _limits
        cap_all = limits.max_per_address
        if cap_all and _open_by_address.get(address, 0) >= cap_all:
            self._refuse(transport, _TOO_MANY_OPEN_FROM_ADDRESS, "too_many_from_address")
            _all_address_refusals.refused(address, cap_all)
            return False
        if cap_all:
            _open_by_address[address] = _open_by_address.get(address, 0) + 1
            self._counted_open = True
        self._address = address
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._stop_lingering()
        if not self._joined:  # refused at once: it never joined the connections
            return
        self._not_slow()
        if self._counted_open and self._address is not None:
            self._counted_open = False
            _decrement(_open_by_address, self._address)
        self._address = None
        if self._unwatched_app is not None:
            self.app = self._unwatched_app  # no cycle through the bound method left behind
        super().connection_lost(exc)

    def _unsupported_upgrade_warning(self) -> None:
        # The gateway serves no WebSocket (uvicorn runs with ws="none"): an upgrade request
        # is answered as plain HTTP, without uvicorn's two log lines for each one, which
        # any client could send to flood the log.
        pass

    async def _watched(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        """The app for the requests of a connection not yet authenticated: learns from
        the response's status whether the request's key was accepted."""
        app = self._unwatched_app
        path = scope.get("path")
        if self._authenticated or not isinstance(path, str):
            await app(scope, receive, send)
            return
        if not path.startswith(_AUTHENTICATING_PATHS):
            await app(scope, receive, send)  # a probe, say: it says nothing of the key
            return

        async def send_watched(message: ASGISendEvent) -> None:
            if (
                message["type"] == "http.response.start"
                and message["status"] not in _UNAUTHENTICATED_STATUSES
            ):
                self._authenticated = True
                self.app = app
            await send(message)

        await app(scope, receive, send_watched)

    def on_response_complete(self) -> None:
        """Keep a connection alive only when it has been authenticated, and only once its
        request's body was read: else read and drop what still comes, for up to
        `_LINGER_S`, and close. A client without a key cannot hold a connection idle
        (between requests, `keepalive_timeout_s`) or trickle a body it was already
        answered for (a byte every `body_gap_timeout_s`)."""
        unread_body = self.cycle is not None and self.cycle.more_body
        super().on_response_complete()
        if self.transport.is_closing() or self.pipeline:
            return
        if unread_body or not self._authenticated:
            self._unset_keepalive_if_required()
            self._waiting = "idle"
            self._linger_close(b"")

    def _refuse(self, transport: asyncio.Transport, response: bytes, reason: str) -> None:
        """Answer a new connection with `response` and close it once it has been read."""
        self._refused = True
        self.transport = transport
        metrics.labels(metrics.CONNECTIONS_CLOSED, reason).inc()
        self._linger_close(response)

    def data_received(self, data: bytes) -> None:
        # Timers are set only when a chunk leaves a request unfinished: a request that
        # arrives whole (the usual case) costs none.
        if self._discarding:
            return
        if self._proxy_prefix is not None:
            data = self._take_proxy_header(data)
            if not data:
                return
        self._chunk_bytes = len(data)
        super().data_received(data)
        waiting = self._waiting
        if waiting == "head":
            # Still unfinished: the parser holds all of it.
            self._head_bytes += self._chunk_bytes
            if self._head_bytes > _limits.max_head_bytes:
                self._refuse_head_too_large()
            elif not self._timer_is_head:
                self._arm_head()
        elif waiting == "body":
            self._arm(_limits.body_gap_timeout_s, self._body_timed_out)
        elif self._timer is not None:
            self._disarm()

    def _take_proxy_header(self, data: bytes) -> bytes:
        """Read the PROXY header off the stream; what follows it, once it is whole."""
        assert self._proxy_prefix is not None
        buffered = self._proxy_prefix + data
        try:
            header = proxy_protocol.parse(buffered)
        except proxy_protocol.ProxyHeaderError as exc:
            self._count("bad_proxy_header", "refused a connection from %s: %s", str(exc))
            self._disarm()
            self._linger_close(_NO_PROXY_HEADER)
            return b""
        if header is None:
            self._proxy_prefix = buffered
            return b""
        self._proxy_prefix = None
        if header.client is not None:
            self.client = header.client
            if not self._admit(self.transport, _address_key(header.client)):
                self._disarm()
                return b""
        return buffered[header.length :]

    def send_400_response(self, msg: str) -> None:
        if self._too_large:
            self._refuse_head_too_large()
        else:
            super().send_400_response(msg)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._waiting != "head":  # the next request on a kept-alive connection
            self._waiting = "head"
            self._head_bytes = 0

    def on_headers_complete(self) -> None:
        self._waiting = "body"
        self._not_slow()
        cap = _limits.max_head_bytes
        # Only a head that came with more than the cap needs its exact size.
        if self._head_bytes + self._chunk_bytes > cap and self._head_size() > cap:
            self._too_large = True
            raise _HeadTooLarge
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._waiting = "idle"
        super().on_message_complete()

    def _head_size(self) -> int:
        return len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)

    def _arm(self, delay: float, callback: Callable[[], None]) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(delay, callback)
        self._timer_is_head = False

    def _arm_head(self) -> None:
        """The head's deadline, first through its grace when the connection is capped."""
        limits = _limits
        grace = limits.slow_head_grace_s
        capped = limits.max_slow_per_address and (
            self._address is not None or self._proxy_prefix is not None
        )
        if capped and not self._slow and grace < limits.head_timeout_s:
            self._head_due = self.loop.time() + limits.head_timeout_s
            self._arm(grace, self._head_slow)
        else:
            self._arm(limits.head_timeout_s, self._head_timed_out)
        self._timer_is_head = True

    def _head_slow(self) -> None:
        """The grace is over and the head is not whole: the connection is slow, unless
        its bytes are waiting for a loop too busy to read them (a burst)."""
        self._timer, self._timer_is_head = None, False
        if self.transport.is_closing():
            return
        left = self._head_due - self.loop.time()
        if left > 0 and _unread_bytes(self.transport):
            # Judged again once the loop has caught up; the deadline stands.
            self._arm(min(left, _limits.slow_head_grace_s), self._head_slow)
            self._timer_is_head = True
            return
        address, cap = self._address, _limits.max_slow_per_address
        if address is not None:
            if _slow_by_address.get(address, 0) >= cap:
                self._count(
                    "too_many_slow_from_address",
                    "closed a connection from %s: no complete request head in %g s, with "
                    "%d slow connections open from its address",
                    _limits.slow_head_grace_s,
                    cap,
                )
                self._linger_close(_TOO_MANY_SLOW_FROM_ADDRESS)
                return
            _slow_by_address[address] = _slow_by_address.get(address, 0) + 1
            self._slow = True
        self._arm(max(0.0, self._head_due - self.loop.time()), self._head_timed_out)
        self._timer_is_head = True

    def _not_slow(self) -> None:
        if self._slow and self._address is not None:
            self._slow = False
            _decrement(_slow_by_address, self._address)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self._timer_is_head = False

    def _head_timed_out(self) -> None:
        self._timer, self._timer_is_head = None, False
        if self.transport.is_closing():
            return
        self._count(
            "head_timeout",
            "closed a connection from %s: no complete request head in %g s (%d bytes)",
            _limits.head_timeout_s,
            self._head_bytes,
        )
        self._linger_close(_HEAD_TIMEOUT)

    def _body_timed_out(self) -> None:
        self._timer = None
        if self.transport.is_closing() or self.cycle is None or not self.cycle.more_body:
            return
        if self.flow.read_paused:  # the app has not read what came: not the client's pause
            self._arm(_limits.body_gap_timeout_s, self._body_timed_out)
            return
        self._count(
            "body_timeout",
            "closed a connection from %s: its request body paused for %g s",
            _limits.body_gap_timeout_s,
        )
        self.transport.close()

    def _refuse_head_too_large(self) -> None:
        self._disarm()
        self._waiting = "idle"
        self._count(
            "head_too_large",
            "refused a request from %s: its head is over %d bytes",
            _limits.max_head_bytes,
        )
        if not self.transport.is_closing():
            self._linger_close(_HEAD_TOO_LARGE)

    def _count(self, reason: str, message: str, *args: object) -> None:
        """Count a connection closed for `reason` and log `message` (its first `%s` is
        the client's address)."""
        metrics.labels(metrics.CONNECTIONS_CLOSED, reason).inc()
        log.warning(message, _peer(self.client), *args)

    def _linger_close(self, response: bytes) -> None:
        """Send `response`, then read and drop what the client still sends for a moment
        before closing: a close with unread data resets the connection, and the client
        would never see the response (nginx's lingering close). Past `_MAX_LINGERING`
        lingering refusals, a refused connection is closed at once."""
        global _lingering
        self._discarding = True
        transport = self.transport
        transport.write(response)
        if self._refused and _lingering >= _MAX_LINGERING:
            transport.close()
            return
        if self._refused:
            _lingering += 1
            self._lingers = True
        if transport.can_write_eof():
            transport.write_eof()
        self._arm(_LINGER_S, transport.close)

    def _stop_lingering(self) -> None:
        global _lingering
        if self._lingers:
            self._lingers = False
            _lingering -= 1


def _decrement(counts: dict[str, int], address: str) -> None:
    """One connection of `address` less in `counts`; an address at 0 leaves it, so the
    dict stays as small as the set of addresses with connections counted."""
    left = counts[address] - 1
    if left:
        counts[address] = left
    else:
        del counts[address]


def _to_port(transport: asyncio.Transport, port: int | None) -> bool:
    """Whether `transport` is a connection to local `port`."""
    local = transport.get_extra_info("sockname")
    return port is not None and isinstance(local, tuple) and local[1] == port


def _unread_bytes(transport: asyncio.Transport) -> bool:
    """Whether the kernel holds bytes of this connection that the loop has not read."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    try:
        count = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except OSError:
        return False
    return int.from_bytes(count, sys.byteorder) > 0


def _from_trusted_proxy(peer: object, limits: ConnectionLimits) -> bool:
    """Whether `peer` is one of `trusted_proxies`."""
    if not limits.trusted_proxies or not isinstance(peer, tuple) or not peer:
        return False
    try:
        address = ipaddress.ip_address(peer[0].partition("%")[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in network for network in limits.trusted_proxies)


def _address_key(peer: object) -> str | None:
    """What a client is counted by: its IPv4 address, or the /64 of its IPv6 address
    (an IPv4 client of a dual-stack socket by its IPv4 address); None without one."""
    if not isinstance(peer, tuple) or not peer or not isinstance(peer[0], str):
        return None  # a Unix socket
    host: str = peer[0].partition("%")[0]  # a link-local address's zone: not the client's
    if ":" not in host:
        return host
    try:
        address = ipaddress.IPv6Address(host)
    except ValueError:
        return host
    if address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return address.exploded[:19] + "::/64"  # its first four groups


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "?"
