"""Waiting in tests for something that happens in the background."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


async def wait_until(check: Callable[[], Awaitable[bool]], timeout_s: float = 10.0) -> float:
    """Seconds until `check()` held; fails after `timeout_s` (a hang guard, not a target)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if await check():
            return time.monotonic() - started
        await asyncio.sleep(0.05)
    raise AssertionError(f"still not so after {timeout_s} s")


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    """Block until `condition()` holds; fails after `timeout_s` naming `what` (a hang
    guard, not a target)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:g}s: {what}")
        time.sleep(0.05)
