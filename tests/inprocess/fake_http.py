"""An HTTP upstream (Triton's HTTP API, an OpenAI-compatible server) as the HTTP
backends see it, without sockets: an aiohttp session stand-in (`post`, `get`) whose
answers a handler scripts, so a backend's real request building, SSE reading, error
mapping (`gateway.backends.http.post`) and parsing run in process."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson


@dataclass
class Answer:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


def generate(**outputs: Any) -> Answer:
    """A `/generate` answer with these outputs."""
    return Answer(body=orjson.dumps(outputs))


def sse(*events: dict[str, Any], done: bool = False) -> Answer:
    """A stream of these events (`/generate_stream`; OpenAI's ends with [DONE])."""
    body = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events)
    return Answer(body=body + (b"data: [DONE]\n\n" if done else b""))


class _Response:
    def __init__(self, answer: Answer) -> None:
        self.status = answer.status
        self.headers = answer.headers
        self._body = answer.body

    async def read(self) -> bytes:
        return self._body

    @property
    def content(self) -> AsyncIterator[bytes]:
        async def lines() -> AsyncIterator[bytes]:
            for line in self._body.splitlines(keepends=True):
                yield line

        return lines()


@dataclass
class Request:
    url: str
    body: dict[str, Any]


class FakeSession:
    """What the HTTP backends use of an aiohttp session."""

    def __init__(self, handler: Callable[[Request], Answer]) -> None:
        self.handler = handler
        self.requests: list[Request] = []
        self.timeout = aiohttp.ClientTimeout(total=30)
        # The session's default headers (a key configured for the upstream goes here).
        self.headers: dict[str, str] = {}

    @asynccontextmanager
    async def post(self, url: str, data: bytes, headers: Any = None) -> AsyncIterator[_Response]:
        request = Request(url, orjson.loads(data))
        self.requests.append(request)
        yield _Response(self.handler(request))

    @asynccontextmanager
    async def get(self, url: str, **_: Any) -> AsyncIterator[_Response]:  # timeout=
        # Readiness: Triton's `/v2/models/M/ready`, an OpenAI server's `/v1/models`.
        ready = url.endswith(("/ready", "/models"))
        yield _Response(Answer(200) if ready else Answer(404))


class FakeLazySession:
    """Stands in for `gateway.backends.http.LazySession`."""

    def __init__(self, session: FakeSession) -> None:
        self.session = session

    def get(self) -> FakeSession:
        return self.session

    async def close(self) -> None:
        pass
