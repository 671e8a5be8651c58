"""One client request as several upstream requests: choices (`n`), a text completion's
list of prompts, an embedding request's batches.

Each part is a request of its own to the dispatcher (admitted, charged and failed over
on its own), so that parts go to different replicas where there are several, and a
model's queue counts every one. The parts of a request run at once; the first failure
cancels the others.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import TypeVar

from gateway.inference.types import Delta, InferenceRequest, RequestKind

T = TypeVar("T")


def split(request: InferenceRequest, max_batch: int) -> list[InferenceRequest]:
    """The parts of `request`, in the order of the answer's `index`: for a completion,
    each prompt's `n` choices in turn; for chat, its `n` choices; for embeddings, its
    inputs in batches of at most `max_batch`.

    Choices after the first of a request with a `seed` get the seeds that follow it, so
    that they differ as sampled choices do, and the same request gets the same choices.
    """
    if request.kind is RequestKind.EMBEDDING:
        inputs = request.inputs
        if len(inputs) <= max_batch:
            return [request]
        return [
            dataclasses.replace(request, inputs=inputs[start : start + max_batch])
            for start in range(0, len(inputs), max_batch)
        ]
    prompts = request.prompts or (request.prompt,)
    if request.n == 1 and len(prompts) == 1:
        return [request]  # the usual request: no copy
    parts = []
    seed = request.params.seed
    for prompt in prompts:
        for choice in range(request.n):
            params = request.params
            if seed is not None and choice:
                params = dataclasses.replace(params, seed=_int64(seed + choice))
            parts.append(dataclasses.replace(request, prompt=prompt, prompts=(), params=params))
    return parts


async def gather_all(
    calls: Sequence[Awaitable[T]], undo: Callable[[T], Awaitable[None]] | None = None
) -> list[T]:
    """The results of `calls`, run at once; the first failure (or a cancel) cancels the
    others, waits for them to end, `undo`es the results that came, and is raised."""
    if len(calls) == 1:
        return [await calls[0]]
    tasks = [asyncio.ensure_future(call) for call in calls]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if undo is not None:
            for task in tasks:
                if not task.cancelled() and task.exception() is None:
                    await undo(task.result())
        raise


async def interleave(
    streams: Sequence[AsyncGenerator[Delta, None]],
) -> AsyncGenerator[tuple[int, Delta | None], None]:
    """Pieces of several streams as they arrive, as (stream index, piece); (index, None)
    once stream `index` has ended. A stream's failure is raised at its place in the
    order. Closing this generator closes every stream."""
    queue: asyncio.Queue[tuple[int, Delta | BaseException | None]] = asyncio.Queue(
        maxsize=len(streams)
    )

    async def pump(index: int, stream: AsyncGenerator[Delta, None]) -> None:
        try:
            async for delta in stream:
                await queue.put((index, delta))
        except Exception as exc:
            await queue.put((index, exc))
        else:
            await queue.put((index, None))

    pumps = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        running = len(streams)
        while running:
            index, item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            if item is None:
                running -= 1
            yield index, item
    finally:
        for task in pumps:
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
        for stream in streams:
            await stream.aclose()


def _int64(value: int) -> int:
    """`value` wrapped into a signed 64-bit integer, as a seed's upstream field holds it
    (the seed after 2**63 - 1 is -2**63; a client may send the largest)."""
    return (value + 2**63) % 2**64 - 2**63
