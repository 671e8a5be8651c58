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
- a cap per client address on connections not yet authenticated: beyond
  `max_unauthenticated_connections_per_address` a new connection from that address gets
  a 429 with Retry-After at once and is closed, so that one address cannot take every
  slot of `max_connections` from everyone else (an IPv6 client counts by its /64, which
  one subscriber usually holds whole);
- a cap per client address on all its connections (`max_connections_per_address`), so
  that a tenant with a valid key cannot hold every slot either, by keeping connections
  alive with requests that cost it nothing.

The gateway serves no WebSocket: an upgrade request is answered as plain HTTP on the
same guarded connection (an upgraded one would leave these counts behind).

Each is counted in `gateway_connections_closed_total{reason}` and logged (a refusal of
too many connections at most once a second, with the count since).

Which connections are authenticated: the protocol never sees an auth result, and the
request path should not have to report one to it. So a connection counts against its
address from accept until a request of its on a path that authenticates (`/v1/`,
`/admin/`, `/metrics`; never a probe, which answers anyone) gets a response other than
401, 404 or 405 (unknown paths and methods answer anyone too). While such a request is
being served the connection counts as authenticated: every route checks the key before
anything else, so a request without a valid one has its 401 within the same step of the
event loop, while a valid one may wait seconds for its first token and must not hold a
place in the count meanwhile. Once authenticated, a connection's requests go to the app
unwatched: the cost is one wrapper around the first request(s) of a connection.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from uvicorn._types import ASGIReceiveCallable, ASGISendCallable, ASGISendEvent, Scope
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.config.schema import ServerConfig
from gateway.observability import metrics
from gateway.transport.errors import APIError

log = logging.getLogger("gateway")

# Descriptors kept for everything that is not a client: upstream pools, Redis, files.
_RESERVED_FDS = 256
# How long a refused connection is read (and dropped) before it is closed.
_LINGER_S = 2.0


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    head_timeout_s: float
    body_gap_timeout_s: float
    max_head_bytes: int
    max_connections: int
    ops_port: int | None
    # 0: no cap per address.
    max_unauthenticated_per_address: int = 0
    max_per_address: int = 0


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
        server.max_unauthenticated_connections_per_address,
        server.max_connections_per_address,
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
_TOO_MANY_FROM_ADDRESS = _response(
    b"429 Too Many Requests",
    _error_body(
        429,
        "Too many connections from your address without an authenticated request; retry shortly.",
        "too_many_connections_from_address",
        "requests",
    ),
    b"retry-after: 1",
)

# Paths whose routes check the API key first (see the module docstring).
_AUTHENTICATING_PATHS = ("/v1/", "/admin/", "/metrics")
# Statuses a request without a valid key may get on those paths.
_UNAUTHENTICATED_STATUSES = frozenset({401, 404, 405})

# Connections not yet authenticated, by address key (`_address_key`), in this worker;
# an address leaves the dict when its count drops to 0, so the dict stays as small as
# the set of addresses with such connections open.
_unauthenticated: dict[str, int] = {}
# All open connections by address key, where `max_per_address` caps them (likewise kept
# as small as the set of addresses with connections open).
_open_by_address: dict[str, int] = {}


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
_address_refusals = _RefusalLog(
    "refused %d connection(s) from a single address, the last from %s: %d connections "
    "without an authenticated request open from it, the limit of this worker"
)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """`HttpToolsProtocol` with a head deadline, a body gap deadline, a head size cap and
    a connection cap (see the module docstring)."""

    _timer: asyncio.TimerHandle | None = None
    _timer_is_head = False
    # What the connection waits for: a request head, the rest of a body, or nothing.
    _waiting: Literal["head", "body", "idle"] = "head"
    # Bytes received while the head was unfinished, by whole chunks.
    _head_bytes = 0
    _chunk_bytes = 0
    _too_large = False
    _refused = False
    # Refused: what still comes is read and dropped until the connection closes.
    _discarding = False
    # Its address's key in `_unauthenticated` until it is authenticated or closed (None
    # when not capped: the cap is off, the ops listener, a Unix socket); `_counted`
    # whether it counts there now (not while a request of its is being authenticated).
    _address: str | None = None
    _counted = False
    # The app itself, while `self.app` is the watching wrapper.
    _unwatched_app: Any = None
    # Its address's key in `_open_by_address` while it is open (None: not capped).
    _open_address: str | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        limits = _limits
        if len(self.connections) >= limits.max_connections and not _to_port(
            transport, limits.ops_port
        ):
            self._refuse(transport, _TOO_MANY, "too_many_connections")
            _refusals.refused(limits.max_connections)
            return
        cap = limits.max_unauthenticated_per_address
        cap_all = limits.max_per_address
        if (cap or cap_all) and not _to_port(transport, limits.ops_port):
            address = _address_key(transport.get_extra_info("peername"))
            # Both caps are checked before either count is taken: a refused connection
            # never reaches `connection_lost`'s uncounting, so it must count nowhere.
            if address is not None and cap_all and _open_by_address.get(address, 0) >= cap_all:
                self._refuse(transport, _TOO_MANY_OPEN_FROM_ADDRESS, "too_many_from_address")
                _all_address_refusals.refused(address, cap_all)
                return
            if address is not None and cap and _unauthenticated.get(address, 0) >= cap:
                self._refuse(transport, _TOO_MANY_FROM_ADDRESS, "too_many_from_address")
                _address_refusals.refused(address, cap)
                return
            if address is not None and cap_all:
                _open_by_address[address] = _open_by_address.get(address, 0) + 1
                self._open_address = address
            if address is not None and cap:
                _unauthenticated[address] = _unauthenticated.get(address, 0) + 1
                self._address, self._counted = address, True
                self._unwatched_app, self.app = self.app, self._watched
        super().connection_made(transport)
        self._arm_head()  # also for a connection that never sends a byte

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return  # it never joined the connections
        self._uncount()
        address, self._open_address = self._open_address, None
        if address is not None:
            _decrement(_open_by_address, address)
        self._address = None  # a request still running must not count it again
        if self._unwatched_app is not None:
            self.app = self._unwatched_app  # no cycle through the bound method left behind
        self._disarm()
        super().connection_lost(exc)

    def _unsupported_upgrade_warning(self) -> None:
        # The gateway serves no WebSocket (uvicorn runs with ws="none"): an upgrade request
        # is answered as plain HTTP, without uvicorn's two log lines for each one, which
        # any client could send to flood the log.
        pass

    def _refuse(self, transport: asyncio.Transport, response: bytes, reason: str) -> None:
        """Answer a new connection with `response` and close it at once (no lingering:
        under a flood, every refused connection held would be a descriptor more)."""
        self._refused = True
        transport.write(response)
        transport.close()
        metrics.labels(metrics.CONNECTIONS_CLOSED, reason).inc()

    async def _watched(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        """The app for the requests of a connection not yet authenticated: learns from
        the response's status whether the request's key was accepted."""
        app = self._unwatched_app
        path = scope.get("path")
        if self._address is None or not isinstance(path, str):
            # Authenticated meanwhile (by an earlier request, pipelined), or closed.
            await app(scope, receive, send)
            return
        if not path.startswith(_AUTHENTICATING_PATHS):
            await app(scope, receive, send)  # a probe, say: it says nothing of the key
            return
        # Out of the count while its key is checked (see the module docstring).
        self._uncount()

        async def send_watched(message: ASGISendEvent) -> None:
            if message["type"] == "http.response.start":
                if message["status"] in _UNAUTHENTICATED_STATUSES:
                    self._count_again()
                else:
                    self._authenticated()
            await send(message)

        try:
            await app(scope, receive, send_watched)
        finally:
            self._count_again()  # no response it sent said: still unauthenticated (no-op else)

    def _authenticated(self) -> None:
        self._uncount()
        self._address = None
        self.app = self._unwatched_app

    def _count_again(self) -> None:
        """Count it against its address again (unless authenticated, closed or counted)."""
        address = self._address
        if address is not None and not self._counted:
            _unauthenticated[address] = _unauthenticated.get(address, 0) + 1
            self._counted = True

    def _uncount(self) -> None:
        address = self._address
        if address is not None and self._counted:
            self._counted = False
            _decrement(_unauthenticated, address)

    def data_received(self, data: bytes) -> None:
        # Timers are set only when a chunk leaves a request unfinished: a request that
        # arrives whole (the usual case) costs none.
        if self._discarding:
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
        self._arm(_limits.head_timeout_s, self._head_timed_out)
        self._timer_is_head = True

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
        would never see the response (nginx's lingering close)."""
        self._discarding = True
        self.transport.write(response)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._arm(_LINGER_S, self.transport.close)


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


def _address_key(peer: object) -> str | None:
    """What a client is counted by: its IPv4 address, or the /64 of its IPv6 address
    (an IPv4 client of a dual-stack socket by its IPv4 address); None without one."""
    if not isinstance(peer, tuple) or not peer or not isinstance(peer[0], str):
        return None  # a Unix socket
    host: str = peer[0]
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
