"""Shared plumbing for HTTP backends: one pooled aiohttp session, error mapping, SSE reading."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from types import TracebackType

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
from gateway.observability import tracing

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


def without_credentials(body: bytes, session: aiohttp.ClientSession) -> bytes:
    """`body` with the session's own credential (its `authorization` header's token, the
    key configured for the upstream) replaced: an upstream that quotes the key it was
    sent in an error must not have it relayed to the client or logged (a 32-hex key is
    no pattern the log's redaction knows: the hostile review of issue 40)."""
    token = credential(session)
    if token and token.encode() in body:
        return body.replace(token.encode(), b"[REDACTED]")
    return body


def credential(session: aiohttp.ClientSession) -> str:
    """The token of the session's `authorization` header ("" without one)."""
    scheme, _, token = session.headers.get("authorization", "").partition(" ")
    token = (token or scheme).strip()
    # A token that short would redact ordinary words.
    return token if len(token) >= 8 else ""


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


def post(session: aiohttp.ClientSession, url: str, payload: bytes) -> Post:
    """POST JSON within the session's timeouts; map transport failures, error statuses
    and answers that are not JSON (read inside the block) to backend errors, whose
    messages say which kind of failure it was and nothing of the library's own text
    (that is their `detail`, for the log). For `async with`: the block gets the
    response."""
    return Post(session, url, payload)


class Post:
    """`post`'s context manager: a class rather than an `asynccontextmanager`, which
    costs an async generator and its wrapper (about 1 µs) on every upstream request.

    The session's own request context is entered and left as `async with` would, and
    whatever fails in `__aenter__`, in the block or in leaving it is mapped after the
    session has left, as it was when this was a generator around `async with`.
    """

    __slots__ = ("_payload", "_request", "_session", "_url")

    def __init__(self, session: aiohttp.ClientSession, url: str, payload: bytes) -> None:
        self._session = session
        self._url = url
        self._payload = payload
        self._request: AbstractAsyncContextManager[aiohttp.ClientResponse] | None = None

    async def __aenter__(self) -> aiohttp.ClientResponse:
        try:
            # A traced request's attempt: its context goes with it (W3C Trace Context).
            traceparent = tracing.upstream_traceparent()
            headers = (
                JSON_HEADERS
                if traceparent is None
                else {**JSON_HEADERS, tracing.TRACEPARENT_HEADER: traceparent}
            )
            request = self._session.post(self._url, data=self._payload, headers=headers)
            response = await request.__aenter__()
        except Exception as exc:
            mapped = _mapped(exc, self._session)
            if mapped is exc:
                raise
            raise mapped from exc
        self._request = request
        if response.status != 200:
            try:
                body = await response.read()
                raise error_from_status(response.status, without_credentials(body, self._session))
            except BaseException as exc:
                await self.__aexit__(type(exc), exc, exc.__traceback__)
                raise
        return response

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        request, self._request = self._request, None
        assert request is not None
        try:
            await request.__aexit__(exc_type, exc, tb)
        except Exception as error:
            mapped = _mapped(error, self._session)
            if mapped is error:
                raise
            raise mapped from error
        if isinstance(exc, Exception):
            mapped = _mapped(exc, self._session)
            if mapped is not exc:
                raise mapped from exc


def _mapped(exc: Exception, session: aiohttp.ClientSession) -> Exception:
    """The backend error a failure of the request stands for; other exceptions as they
    are (the backend's own errors, a bug)."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        # Refused, no route, no such host.
        return ReplicaUnavailable(CONNECT_FAILED, _described(exc))
    if isinstance(exc, aiohttp.ConnectionTimeoutError):  # no connection within sock_connect
        return ReplicaUnavailable(CONNECT_FAILED, _described(exc))
    if isinstance(exc, aiohttp.ClientConnectionError | aiohttp.ClientPayloadError):
        # Reset, or cut mid-body (a replica that died).
        return ReplicaUnavailable(CONNECTION_LOST, _described(exc))
    if isinstance(exc, aiohttp.ClientResponseError):  # not HTTP as aiohttp reads it
        return ReplicaUnavailable(BAD_ANSWER, _described(exc))
    if isinstance(exc, orjson.JSONDecodeError):
        return UpstreamError(BAD_ANSWER, _described(exc))
    if isinstance(exc, LineTooLong):
        # An event line past the read buffer (`sse_payloads`): an answer the gateway
        # will not read, as one that is not JSON (before any output, the next model of
        # the chain may take the request).
        return UpstreamError(BAD_ANSWER, _described(exc))
    if isinstance(exc, TimeoutError):
        detail = f"no answer within the timeout ({session.timeout.total} s)"
        return UpstreamTimeout(TIMED_OUT, detail)
    return exc


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
