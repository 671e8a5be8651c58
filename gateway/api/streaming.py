"""Relaying a stream of server-sent events to a client that may read slowly, or leave.

Each event goes out as soon as it is made: nothing buffers a whole answer. When the
client reads slower than the upstream writes, uvicorn's flow control makes `send`
wait once the connection's write buffer passes its high-water mark (64 KiB), so the
relay stops pulling from the upstream and memory per stream stays bounded. A client
that takes nothing for `stall_timeout_s` is cut off, and so is the stream of a client
that has gone away: the relay stops, the events generator is closed (which cancels the
upstream request and settles the request's slot and tokens), and the connection is
dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Mapping
from enum import StrEnum

from starlette.responses import Response
from starlette.types import Receive, Scope, Send


class StreamCut(StrEnum):
    """Why a stream ended before its last event."""

    CLIENT_STALLED = "client_stalled"  # took no event for the stall timeout
    CLIENT_GONE = "client_gone"  # closed the connection


class EventStreamResponse(Response):
    """`text/event-stream` from an async generator of encoded events."""

    media_type = "text/event-stream"

    def __init__(
        self,
        events: AsyncGenerator[bytes, None],
        stall_timeout_s: float,
        headers: Mapping[str, str] | None = None,
        on_cut: Callable[[StreamCut], None] | None = None,
    ) -> None:
        self.status_code = 200
        self.background = None
        self.init_headers(headers)
        self._events = events
        self._stall_timeout_s = stall_timeout_s
        self._on_cut = on_cut
        self._client_gone = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # uvicorn's `send` does nothing once the client is gone; only `receive` says so.
        watcher = asyncio.create_task(self._watch(receive))
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for event in self._events:
                if self._client_gone:
                    self._cut(StreamCut.CLIENT_GONE)
                    return
                try:
                    async with asyncio.timeout(self._stall_timeout_s):
                        await send({"type": "http.response.body", "body": event, "more_body": True})
                except TimeoutError:
                    # Returning without ending the response makes the server drop the
                    # connection.
                    self._cut(StreamCut.CLIENT_STALLED)
                    return
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watcher.cancel()
            await self._events.aclose()

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self._client_gone = True

    def _cut(self, reason: StreamCut) -> None:
        if self._on_cut is not None:
            self._on_cut(reason)
