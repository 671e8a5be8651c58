"""Shared plumbing for HTTP backends: one pooled aiohttp session, error mapping, SSE reading."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import orjson
from aiohttp.http_exceptions import LineTooLong

from gateway.backends.base import (
    BAD_ANSWER,
    CONNECT_FAILED,
    CONNECTION_LOST,
    TIMED_OUT,
    ReplicaUnavailable,
    UpstreamError,
    UpstreamRejected,
    UpstreamTimeout,
    http_status_failure,
    plain_reason,
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
    """The failure an upstream HTTP error status stands for. The client is told the
    status; of a refusal (4xx), also the upstream's reason if its JSON error gives a
    plain one. The body is for the log."""
    said = _json_error(body)
    detail = f"HTTP {status}: {said if said is not None else body[:300].decode(errors='replace')}"
    if status in _RETRYABLE_STATUS:
        return ReplicaUnavailable(http_status_failure(status), detail)
    reason = plain_reason(said) if said is not None and 400 <= status < 500 else None
    return UpstreamRejected(reason or http_status_failure(status), status, detail)


def _json_error(body: bytes) -> str | None:
    """The message of a JSON error body (OpenAI's `{"error": {"message"}}`, Triton's
    `{"error": "..."}`, also as the one event of `generate_stream`'s error answer); None
    for any other body."""
    if body.startswith(b"data:"):
        body = body[5:]
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict):
            return str(err.get("message", ""))
        if err is not None:
            return str(err)
    return None


@asynccontextmanager
async def post(
    session: aiohttp.ClientSession, url: str, payload: bytes
) -> AsyncIterator[aiohttp.ClientResponse]:
    """POST JSON within the session's timeouts; map transport failures, error statuses
    and answers that are not JSON (read inside the block) to backend errors, whose
    messages say which kind of failure it was and nothing of the library's own text
    (that is their `detail`, for the log)."""
    try:
        async with session.post(url, data=payload, headers=JSON_HEADERS) as response:
            if response.status != 200:
                raise error_from_status(response.status, await response.read())
            yield response
    except aiohttp.ClientConnectorError as exc:
        # Refused, no route, no such host.
        raise ReplicaUnavailable(CONNECT_FAILED, _described(exc)) from exc
    except aiohttp.ConnectionTimeoutError as exc:  # no connection within sock_connect
        raise ReplicaUnavailable(CONNECT_FAILED, _described(exc)) from exc
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
        # Reset, or cut mid-body (a replica that died).
        raise ReplicaUnavailable(CONNECTION_LOST, _described(exc)) from exc
    except aiohttp.ClientResponseError as exc:  # not HTTP as aiohttp reads it
        raise ReplicaUnavailable(BAD_ANSWER, _described(exc)) from exc
    except orjson.JSONDecodeError as exc:
        raise UpstreamError(BAD_ANSWER, _described(exc)) from exc
    except TimeoutError as exc:
        detail = f"no answer within the timeout ({session.timeout.total} s)"
        raise UpstreamTimeout(TIMED_OUT, detail) from exc


def _described(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


async def sse_payloads(response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """The payload of each `data:` line of a server-sent event stream.

    Lines end at `\n` (a `\r` before it is stripped with the payload's spaces), the last
    one at the end of the body. The body is read as it arrives and split here, not line
    by line: aiohttp's `readline` costs a coroutine and a buffer search per line, the
    blank line after each event included, while one read usually holds several events.
    A line longer than the stream's buffer limit raises `LineTooLong`, as `readline` does.
    """
    content = response.content
    if not isinstance(content, aiohttp.StreamReader):
        # A stand-in for the response (tests/inprocess/fake_http.py) gives its lines.
        async for line in content:
            if line.startswith(b"data:"):
                yield line[5:].strip()
        return
    limit = content.get_read_buffer_limits()[1]
    # The start of a line not yet ended, in the pieces it came in, and its length.
    head: list[bytes] = []
    size = 0
    while chunk := await content.readany():
        end = chunk.rfind(b"\n")
        if end >= 0:
            if head:
                head.append(chunk)
                chunk = b"".join(head)
                end += size
            for line in chunk[:end].split(b"\n"):
                if len(line) >= limit:  # with its newline, over the limit
                    raise LineTooLong(line[:100] + b"...", limit)
                if line.startswith(b"data:"):
                    yield line[5:].strip()
            chunk = chunk[end + 1 :]
            head, size = [], 0
        if chunk:
            head.append(chunk)
            size += len(chunk)
            if size > limit:
                raise LineTooLong(b"".join(head)[:100] + b"...", limit)
    line = b"".join(head)
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
