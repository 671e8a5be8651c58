"""Shared plumbing for HTTP backends: one pooled aiohttp session, error mapping, SSE reading."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import orjson

from gateway.backends.base import (
    ReplicaUnavailable,
    UpstreamError,
    UpstreamRejected,
    UpstreamTimeout,
)

JSON_HEADERS = {"content-type": "application/json"}

# Statuses that say "this replica, now" rather than "this request": another replica may serve it.
_RETRYABLE_STATUS = frozenset({404, 408, 429, 500, 502, 503, 504})


def new_session(
    connect_timeout_s: float, total_timeout_s: float | None, headers: dict[str, str] | None = None
) -> aiohttp.ClientSession:
    """A keep-alive session; measured several times faster per request than httpx here."""
    connector = aiohttp.TCPConnector(
        limit=0,  # the admission layer bounds concurrency, not the pool
        ttl_dns_cache=300,
        keepalive_timeout=30,
    )
    return aiohttp.ClientSession(
        connector=connector,
        # One timeout for every request: a request's own would replace it whole, connect
        # timeout included, and cost a new object each time.
        timeout=aiohttp.ClientTimeout(total=total_timeout_s, sock_connect=connect_timeout_s),
        json_serialize=lambda obj: orjson.dumps(obj).decode(),
        skip_auto_headers=("User-Agent",),
        headers=headers,
        # An upstream's cookies must not follow one tenant's request into another's.
        cookie_jar=aiohttp.DummyCookieJar(),
    )


class LazySession:
    """One pooled session per backend, made on first use inside the running event loop."""

    def __init__(
        self,
        connect_timeout_s: float,
        total_timeout_s: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self._connect_timeout_s = connect_timeout_s
        self._total_timeout_s = total_timeout_s
        self._headers = headers
        self._session: aiohttp.ClientSession | None = None

    def get(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = new_session(
                self._connect_timeout_s, self._total_timeout_s, self._headers
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def error_from_status(status: int, body: bytes) -> UpstreamError:
    """The failure an upstream HTTP error status stands for."""
    message = _error_message(body) or f"HTTP {status}"
    if status in _RETRYABLE_STATUS:
        return ReplicaUnavailable(f"HTTP {status}: {message}")
    return UpstreamRejected(message, status)


def _error_message(body: bytes) -> str:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:200].decode(errors="replace").strip()
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict):
            return str(err.get("message", ""))
        if err is not None:
            return str(err)
    return ""


@asynccontextmanager
async def post(
    session: aiohttp.ClientSession, url: str, payload: bytes
) -> AsyncIterator[aiohttp.ClientResponse]:
    """POST JSON within the session's timeouts; map transport failures and error
    statuses to backend errors."""
    try:
        async with session.post(url, data=payload, headers=JSON_HEADERS) as response:
            if response.status != 200:
                raise error_from_status(response.status, await response.read())
            yield response
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
        # Refused, reset, or cut mid-body (a replica that died).
        raise ReplicaUnavailable(f"{type(exc).__name__}: {exc}") from exc
    except TimeoutError as exc:
        raise UpstreamTimeout(f"no answer within {session.timeout.total:g}s") from exc


async def sse_payloads(response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """The payload of each `data:` line of a server-sent event stream."""
    async for line in response.content:
        if line.startswith(b"data:"):
            yield line[5:].strip()


async def get_ok(session: aiohttp.ClientSession, url: str, timeout_s: float) -> bool:
    """Whether GET url answers 200 in time."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            await resp.read()
            return resp.status == 200
    except (TimeoutError, aiohttp.ClientError, OSError):
        return False
