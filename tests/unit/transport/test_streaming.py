"""EventStreamResponse ends every stream's bookkeeping, even one that never started."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest
from starlette.types import Message

from gateway.transport.streaming import EventStreamResponse


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
