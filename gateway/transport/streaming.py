"""Relaying a stream of server-sent events to a client that may read slowly, or leave.

Each event goes out as soon as it is made: nothing buffers a whole answer. When the
client reads slower than the upstream writes, uvicorn's flow control makes `send`
wait once the connection's write buffer passes its high-water mark (64 KiB), so the
relay stops pulling from the upstream and memory per stream stays bounded. A client
that takes nothing for `stall_timeout_s` is cut off, and so is the stream of a client
that has gone away: the relay stops, the events generator is closed (which cancels the
upstream request and settles the request's slot and tokens), and the connection is
dropped.

`DisconnectWatch` is how the gateway learns that a client left, from the moment its
request body has been read: before a stream starts (queued, or waiting for the upstream)
as well as during it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator, Mapping
from contextvars import ContextVar
from enum import StrEnum
from typing import Any

from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

# Set in the task of a request whose stream the relay cut off on purpose: uvicorn's
# complaint that the app returned without completing the response is then expected.
_CUT_ON_PURPOSE: ContextVar[bool] = ContextVar("gateway_stream_cut", default=False)
_UNCOMPLETED = "ASGI callable returned without completing response."


class CutStreamLogFilter(logging.Filter):
    """Drops uvicorn's error line for a stream the relay cut off (a client that stalled
    or left: counted in `gateway_streams_cut_total` and logged 499 already), so that a
    tenant cannot write an error line a stream; the same line for any other response
    still goes out. For the `uvicorn.error` logger."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == _UNCOMPLETED and _CUT_ON_PURPOSE.get())


# The one instance: adding it again (an app built anew in the same process) adds nothing.
CUT_STREAM_LOG_FILTER = CutStreamLogFilter()


class StreamCut(StrEnum):
    """Why a stream ended before its last event."""

    CLIENT_STALLED = "client_stalled"  # took no event for the stall timeout
    CLIENT_GONE = "client_gone"  # closed the connection


class ClientGone(Exception):
    """The client closed its connection before its answer was ready."""


class DisconnectWatch:
    """Notices the client closing its connection, with no task of its own.

    Once the request body has been read, the server's next `receive()` message is
    `http.disconnect`: when the client leaves, or when the response is complete (so a
    watch must be stopped before a response is sent, or it reports that as well). uvicorn
    does not cancel a handler whose client left, and its `send` then does nothing, so only
    `receive` tells.

    The watch runs that `receive()` itself, the way a task would: it steps the coroutine
    from the done-callback of the future it waits on. Nothing runs until the message
    comes, no task is created, and `stop` just closes the coroutine. Then `gone` is True
    and `on_gone` (if set then) is called.
    """

    __slots__ = ("_coro", "_receive", "gone", "on_gone")

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self.gone = False
        self.on_gone: Callable[[], object] | None = None
        # `receive()` as a task would run it: what its `__await__` gives.
        self._coro: Generator[Any, None, Message] | None = receive().__await__()
        self._step()

    def cancel_when_gone(self) -> None:
        """From now on, the client leaving cancels the task this is called in (unless it
        has left already: `gone` says so, and nothing is cancelled)."""
        task = asyncio.current_task()
        if not self.gone and task is not None:
            self.on_gone = task.cancel

    def stop(self) -> None:
        """Stop watching; later messages go unread. Stopping again does nothing."""
        coro = self._coro
        if coro is not None:
            self._coro = None
            coro.close()

    def _step(self, _: object = None) -> None:
        """Run `receive()` on until it waits again, or returns (what a task step does)."""
        while (coro := self._coro) is not None:
            try:
                waiting = coro.send(None)
            except StopIteration as done:
                if done.value["type"] != "http.disconnect":
                    self._coro = self._receive().__await__()  # body nobody reads: wait on
                    continue
                self._coro = None
                self.gone = True
                if self.on_gone is not None:
                    self.on_gone()
                return
            except (Exception, asyncio.CancelledError):
                self._coro = None  # the server's receive failed: nothing more to learn
                return
            if getattr(waiting, "_asyncio_future_blocking", False):
                waiting._asyncio_future_blocking = False
                waiting.add_done_callback(self._step)
            else:  # a bare yield (`asyncio.sleep(0)`): on at the next loop turn
                asyncio.get_running_loop().call_soon(self._step)
            return


class EventStreamResponse(Response):
    """`text/event-stream` from an async generator of encoded events.

    `watch` notices the client leaving (one made earlier, for the request, or a new one).
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        events: AsyncGenerator[bytes, None],
        stall_timeout_s: float,
        headers: Mapping[str, str] | None = None,
        on_cut: Callable[[StreamCut], None] | None = None,
        on_close: Callable[[], Awaitable[None]] | None = None,
        watch: DisconnectWatch | None = None,
        keepalive: tuple[float, bytes] | None = None,
    ) -> None:
        self.status_code = 200
        self.background = None
        self.init_headers(headers)
        self._events = events
        self._stall_timeout_s = stall_timeout_s
        self._on_cut = on_cut
        self._on_close = on_close
        self._watch = watch
        # (seconds, event): sent whenever no event came for that long (Anthropic's ping).
        self._keepalive = keepalive

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # uvicorn's `send` does nothing once the client is gone; only `receive` says so.
        watch = self._watch or DisconnectWatch(receive)
        watch.on_gone = None  # the relay looks at `gone` before each event
        keepalive = None if self._keepalive is None else _Keepalive(send, *self._keepalive)
        stall = _StallWatch(self._stall_timeout_s)
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            if keepalive is not None:
                keepalive.arm()
            async for event in self._events:
                if watch.gone:
                    self._cut(StreamCut.CLIENT_GONE)
                    return
                stall.sending()
                try:
                    await send({"type": "http.response.body", "body": event, "more_body": True})
                except asyncio.CancelledError:
                    if not stall.took_back():
                        raise
                    # Returning without ending the response makes the server drop the
                    # connection.
                    self._cut(StreamCut.CLIENT_STALLED)
                    return
                stall.sent()
                if keepalive is not None:
                    keepalive.arm()
            if keepalive is not None:
                await keepalive.stop()  # no ping after the end
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            stall.stop()
            watch.stop()
            if keepalive is not None:
                await keepalive.stop()
            try:
                await self._events.aclose()
            finally:
                # Closing a generator that never started skips its cleanup: this runs it.
                if self._on_close is not None:
                    await self._on_close()

    def _cut(self, reason: StreamCut) -> None:
        # Returning without ending the response makes uvicorn drop the connection, and
        # log an error that here is no error (`CutStreamLogFilter`).
        _CUT_ON_PURPOSE.set(True)
        if self._on_cut is not None:
            self._on_cut(reason)


class _StallWatch:
    """Cuts the relay off when one `send` has waited `timeout_s` for the client to read.

    A `send` waits only while the client's buffer is full, so one timer for the whole
    stream watches them all: each `send` notes when it started, and the timer, when it
    fires, cancels the relay's task if the `send` in progress started `timeout_s` ago,
    else comes back when that one would be due (an `asyncio.timeout` around every event
    cost a fifth of the relay's own time). The cancel is taken back by `took_back`.
    """

    __slots__ = ("_expired", "_loop", "_started", "_task", "_timeout_s", "_timer")

    def __init__(self, timeout_s: float) -> None:
        self._timeout_s = timeout_s
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        # The loop's time when the `send` in progress started; None: none in progress.
        self._started: float | None = None
        self._expired = False
        self._timer: asyncio.TimerHandle | None = self._loop.call_later(timeout_s, self._check)

    def sending(self) -> None:
        """A `send` starts."""
        self._started = self._loop.time()

    def sent(self) -> None:
        """The `send` is done."""
        self._started = None

    def _check(self) -> None:
        now = self._loop.time()
        started = self._started
        if started is not None and now - started >= self._timeout_s:
            self._timer = None
            if self._task is not None:
                self._expired = True
                self._task.cancel()
            return
        due = self._timeout_s if started is None else started + self._timeout_s - now
        self._timer = self._loop.call_later(due, self._check)

    def took_back(self) -> bool:
        """Whether a cancel that reached the relay was this watch's: then it is taken back
        (and the client stalled), unless another cancel came too."""
        if not self._expired or self._task is None:
            return False
        self._expired = False
        return self._task.uncancel() == 0

    def stop(self) -> None:
        """Watch no more."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class _Keepalive:
    """Sends a keepalive event whenever the stream has sent nothing for `interval`
    seconds: one timer, re-armed after each event (no task per event). The keepalive goes
    out from a task of its own while the relay waits for the next event; uvicorn writes
    each `send` whole, so events are never interleaved, and at most one keepalive is in
    flight (a client that reads nothing does not pile them up)."""

    __slots__ = ("_interval", "_message", "_send", "_task", "_timer")

    def __init__(self, send: Send, interval: float, event: bytes) -> None:
        self._send = send
        self._interval = interval
        self._message: Message = {"type": "http.response.body", "body": event, "more_body": True}
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None

    def arm(self) -> None:
        """(Re)start the wait for the next keepalive."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(self._interval, self._fire)

    def _fire(self) -> None:
        self._timer = None
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._ping())
        self.arm()

    async def _ping(self) -> None:
        await self._send(self._message)

    async def stop(self) -> None:
        """No keepalive from now on (one on its way is cancelled, or has gone out)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
