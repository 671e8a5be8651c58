"""Batch lines take only the slots online traffic leaves: what the worker is told is free,
and the order admission grants in once lines and online requests both wait."""

from __future__ import annotations

import asyncio

from gateway.admission import AdmissionController
from gateway.admission.queue import BATCH_API_CLASS
from gateway.batches.idle_slots import AdmissionIdleSlots

CLASSES = ("online", "batch", BATCH_API_CLASS)


def _controller(slots: int) -> AdmissionController:
    admission = AdmissionController(CLASSES)
    admission.configure_model("llm", 16, lambda: slots)
    return admission


async def test_free_slots_are_those_nobody_holds_less_the_lines_on_their_way() -> None:
    admission = _controller(4)
    idle = AdmissionIdleSlots(admission)
    assert idle.free_for_batch("llm", mine=0) == 4
    online = await admission.acquire("llm", "acme", priority="online", cost_tokens=10)
    assert idle.free_for_batch("llm", mine=0) == 3
    # Two lines claimed here, one holding a slot already, one on its way to one.
    line = await admission.acquire("llm", "batchco", priority=BATCH_API_CLASS, cost_tokens=5)
    assert idle.free_for_batch("llm", mine=2) == 1
    admission.release(online, 10)
    admission.release(line, 5)
    assert idle.free_for_batch("llm", mine=0) == 4
    assert idle.free_for_batch("gone-model", mine=0) == 0


async def test_nothing_is_free_for_lines_while_an_online_request_waits() -> None:
    admission = _controller(1)
    idle = AdmissionIdleSlots(admission)
    held = await admission.acquire("llm", "acme", priority="online", cost_tokens=10)
    waiting = asyncio.create_task(
        admission.acquire("llm", "acme", priority="online", cost_tokens=10)
    )
    await asyncio.sleep(0)
    admission.capacity_changed("llm")
    assert idle.free_for_batch("llm", mine=0) == 0
    admission.release(held, 10)
    admission.release(await waiting, 10)
    assert idle.free_for_batch("llm", mine=0) == 1


async def test_an_online_request_is_served_before_every_line_that_waits_with_it() -> None:
    admission = _controller(2)
    held = [
        await admission.acquire("llm", "acme", priority="online", cost_tokens=1) for _ in range(2)
    ]
    # Lines queue first, then an online request arrives behind them.
    lines = [
        asyncio.create_task(
            admission.acquire("llm", "batchco", priority=BATCH_API_CLASS, cost_tokens=1)
        )
        for _ in range(3)
    ]
    await asyncio.sleep(0)
    online = asyncio.create_task(admission.acquire("llm", "acme", priority="online", cost_tokens=1))
    await asyncio.sleep(0)
    admission.release(held[0], 1)
    await asyncio.sleep(0)
    assert online.done() and not any(line.done() for line in lines)
    admission.release(held[1], 1)
    await asyncio.sleep(0)
    assert sum(line.done() for line in lines) == 1
    assert admission.snapshot("llm").delayed_by_batch == 0
    admission.release(online.result(), 1)
    for line in lines:
        if not line.done():
            await asyncio.sleep(0)
    for line in lines:
        admission.release(await line, 1)


async def test_reserved_slots_stay_free_for_online_arrivals() -> None:
    admission = _controller(4)
    idle = AdmissionIdleSlots(admission, reserve=1)
    assert idle.free_for_batch("llm", mine=0) == 3
    online = [
        await admission.acquire("llm", "acme", priority="online", cost_tokens=1) for _ in range(3)
    ]
    assert idle.free_for_batch("llm", mine=0) == 0
    for slot in online:
        admission.release(slot, 1)
