"""EventStreamResponse ends every stream's bookkeeping, even one that never started."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import AsyncGenerator

import pytest
from starlette.types import Message

from gateway.transport.streaming import CUT_STREAM_LOG_FILTER, EventStreamResponse, StreamCut

UNCOMPLETED = "ASGI callable returned without completing response."


def one_event_stream(ran: list[str]) -> EventStreamResponse:
    """A response of one event whose generator cleanup and `on_close` note in `ran`."""

    async def events() -> AsyncGenerator[bytes, None]:
        try:
            yield b"data: 1\n\n"
        finally:
            ran.append("generator cleanup")

    async def on_close() -> None:
        ran.append("on_close")

    return EventStreamResponse(events(), stall_timeout_s=5.0, on_close=on_close)


async def never_leaves() -> Message:
    await asyncio.Event().wait()  # the client stays
    raise AssertionError


async def test_on_close_runs_when_the_events_never_started() -> None:
    """Closing an async generator that never started skips its `finally`: the slot,
    lease and token settle it holds are released by `on_close` instead."""
    ran: list[str] = []

    async def send(message: Message) -> None:
        raise OSError("connection reset")  # the very first send fails

    with pytest.raises(OSError):
        await one_event_stream(ran)({"type": "http"}, never_leaves, send)
    assert ran == ["on_close"]


async def test_on_close_runs_after_a_stream_that_ran() -> None:
    ran: list[str] = []
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    await one_event_stream(ran)({"type": "http"}, never_leaves, send)
    assert [m.get("body") for m in sent[1:]] == [b"data: 1\n\n", b""]
    assert ran == ["generator cleanup", "on_close"]


def slow_events(count: int, gap_s: float) -> AsyncGenerator[bytes, None]:
    async def events() -> AsyncGenerator[bytes, None]:
        for index in range(count):
            await asyncio.sleep(gap_s)
            yield f"data: {index}\n\n".encode()

    return events()


async def test_a_client_that_reads_nothing_is_cut_off_at_the_stall_timeout() -> None:
    cuts: list[StreamCut] = []
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)
        if message.get("body") == b"data: 1\n\n":
            await asyncio.Event().wait()  # the client's buffer is full, and stays full

    response = EventStreamResponse(slow_events(5, 0.0), stall_timeout_s=0.05, on_cut=cuts.append)
    await response({"type": "http"}, never_leaves, send)
    assert cuts == [StreamCut.CLIENT_STALLED]
    assert not any(m.get("more_body") is False for m in sent)  # never ended: dropped
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0  # the watch's cancel taken back
    # uvicorn's complaint that the response was not completed is expected here: not
    # logged (a tenant could write an error line a stream), in this request's task only.
    complaint = logging.LogRecord("uvicorn.error", logging.ERROR, "", 0, UNCOMPLETED, None, None)
    assert not CUT_STREAM_LOG_FILTER.filter(complaint)

    async def another_request() -> bool:
        return CUT_STREAM_LOG_FILTER.filter(complaint)

    assert await asyncio.create_task(another_request(), context=contextvars.Context())


async def test_an_upstream_slower_than_the_stall_timeout_is_not_a_stalled_client() -> None:
    # Only a send that waits counts: events that come slowly from upstream, each read at
    # once by the client, never trip the timeout.
    cuts: list[StreamCut] = []
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    response = EventStreamResponse(slow_events(3, 0.08), stall_timeout_s=0.05, on_cut=cuts.append)
    await response({"type": "http"}, never_leaves, send)
    assert cuts == []
    assert [m.get("body") for m in sent[1:]] == [
        b"data: 0\n\n",
        b"data: 1\n\n",
        b"data: 2\n\n",
        b"",
    ]


async def test_a_cancel_from_elsewhere_is_not_taken_for_a_stall() -> None:
    cuts: list[StreamCut] = []

    async def send(message: Message) -> None:
        if message.get("body"):
            await asyncio.Event().wait()

    response = EventStreamResponse(slow_events(1, 0.0), stall_timeout_s=5.0, on_cut=cuts.append)
    relay = asyncio.create_task(response({"type": "http"}, never_leaves, send))
    await asyncio.sleep(0.01)
    relay.cancel()  # the server shutting down, say
    with pytest.raises(asyncio.CancelledError):
        await relay
    assert cuts == []
