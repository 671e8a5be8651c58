"""`gateway.upstream.failover.Timeout` behaves as `asyncio.timeout`: each case runs both
and expects the same outcome."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager, asynccontextmanager

import pytest

from gateway.upstream.failover import Timeout

Body = Callable[[], Awaitable[str]]
Manager = AbstractContextManager[object] | AbstractAsyncContextManager[object]
Maker = Callable[[], Manager]


@asynccontextmanager
async def _entered(manager: Manager) -> AsyncIterator[None]:
    if isinstance(manager, AbstractContextManager):
        with manager:
            yield
    else:
        async with manager:
            yield


async def _outcome(manager: Manager, body: Body) -> str:
    try:
        async with _entered(manager):
            return await body()
    except TimeoutError as exc:
        assert isinstance(exc.__cause__, asyncio.CancelledError)
        return "TimeoutError"
    except asyncio.CancelledError:
        return "CancelledError"


async def _both(delay: float | None, body: Body) -> tuple[str, str]:
    """The outcome under Timeout and under asyncio.timeout, each in a task of its own,
    with what the task's cancel count ends at."""

    async def run(make: Maker) -> str:
        outcome = await _outcome(make(), body)
        task = asyncio.current_task()
        assert task is not None
        return f"{outcome}, cancelling={task.cancelling()}"

    outcomes: list[str] = []

    async def recorded(make: Maker) -> None:
        outcomes.append(await run(make))

    for make in (lambda: Timeout(delay), lambda: asyncio.timeout(delay)):
        task = asyncio.create_task(recorded(make))
        # A cancel the body left pending cancels the task at its end, after the record.
        await asyncio.gather(task, return_exceptions=True)
    ours, theirs = outcomes
    return ours, theirs


async def _quick() -> str:
    await asyncio.sleep(0)
    return "done"


async def _slow() -> str:
    await asyncio.sleep(10)
    return "done"


async def _swallows() -> str:
    try:
        await asyncio.sleep(10)
    except asyncio.CancelledError:
        return "swallowed"
    return "done"


@pytest.mark.parametrize(
    ("delay", "body", "expected"),
    [
        (1.0, _quick, "done, cancelling=0"),
        (None, _quick, "done, cancelling=0"),
        (0.01, _slow, "TimeoutError, cancelling=0"),
        (0.0, _slow, "TimeoutError, cancelling=0"),
        (-1.0, _slow, "TimeoutError, cancelling=0"),
        (0.01, _swallows, "swallowed, cancelling=0"),
    ],
)
async def test_same_outcome_as_asyncio_timeout(
    delay: float | None, body: Body, expected: str
) -> None:
    ours, theirs = await _both(delay, body)
    assert ours == theirs == expected


async def test_a_cancel_from_outside_passes_through_even_after_expiry() -> None:
    async def cancelled_meanwhile() -> str:
        task = asyncio.current_task()
        assert task is not None
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            task.cancel()  # another cancel, as from the client leaving, on top of expiry
            raise
        return "done"

    ours, theirs = await _both(0.01, cancelled_meanwhile)
    assert ours == theirs == "CancelledError, cancelling=1"


async def test_an_outside_cancel_before_expiry_is_not_a_timeout() -> None:
    async def run(make: Maker) -> str:
        task = asyncio.create_task(_outcome(make(), _slow))
        await asyncio.sleep(0.01)
        task.cancel()
        return await task

    assert (
        await run(lambda: Timeout(10.0))
        == await run(lambda: asyncio.timeout(10.0))
        == "CancelledError"
    )


async def test_needs_a_task() -> None:
    def outside() -> None:
        with Timeout(1.0):
            pass

    loop = asyncio.get_running_loop()
    done: asyncio.Future[BaseException | None] = loop.create_future()

    def callback() -> None:
        try:
            outside()
        except RuntimeError as exc:
            done.set_result(exc)
        else:
            done.set_result(None)

    loop.call_soon(callback)
    assert isinstance(await done, RuntimeError)
