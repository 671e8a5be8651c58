"""The parts of a request with several choices, prompts or inputs, and how they run."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator

import pytest

from gateway.inference.types import Delta, InferenceRequest, RequestKind, SamplingParams
from gateway.serving.fanout import gather_all, interleave, split

TEXT = InferenceRequest(
    kind=RequestKind.COMPLETION, model="m", params=SamplingParams(4, seed=10), prompt="a"
)


def test_one_choice_of_one_prompt_is_the_request_itself() -> None:
    assert split(TEXT, 1)[0] is TEXT


def test_choices_come_per_prompt_with_the_seeds_that_follow() -> None:
    request = dataclasses.replace(TEXT, prompts=("a", "b"), n=2)
    parts = split(request, 1)
    assert [(p.prompt, p.params.seed, p.prompts) for p in parts] == [
        ("a", 10, ()),
        ("a", 11, ()),
        ("b", 10, ()),
        ("b", 11, ()),
    ]


def test_choices_without_a_seed_get_none() -> None:
    request = dataclasses.replace(TEXT, params=SamplingParams(4), n=3)
    assert [p.params.seed for p in split(request, 1)] == [None, None, None]


def test_the_seeds_after_the_largest_wrap_within_64_bits() -> None:
    """A client may send the largest int64 seed with `n: 2`; the second choice's seed
    must still be one Triton's int64 parameter holds (it was a 500)."""
    request = dataclasses.replace(TEXT, n=3, params=SamplingParams(4, seed=2**63 - 1))
    assert [p.params.seed for p in split(request, 1)] == [2**63 - 1, -(2**63), -(2**63) + 1]


def test_embedding_inputs_come_in_batches_in_order() -> None:
    request = InferenceRequest(
        kind=RequestKind.EMBEDDING, model="e", params=SamplingParams(0), inputs=tuple("abcde")
    )
    assert [p.inputs for p in split(request, 2)] == [("a", "b"), ("c", "d"), ("e",)]
    assert split(request, 5) == [request]


async def test_a_failure_cancels_the_other_parts_and_undoes_those_done() -> None:
    undone: list[int] = []
    slow_cancelled = asyncio.Event()

    async def done() -> int:
        return 1

    async def slow() -> int:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            slow_cancelled.set()
            raise
        return 2

    async def failing() -> int:
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        raise ValueError("down")

    async def undo(result: int) -> None:
        undone.append(result)

    with pytest.raises(ValueError, match="down"):
        await gather_all([done(), slow(), failing()], undo)
    assert slow_cancelled.is_set()
    assert undone == [1]


async def test_results_come_in_the_order_of_the_calls() -> None:
    async def after(delay: int, value: str) -> str:
        for _ in range(delay):
            await asyncio.sleep(0)
        return value

    assert await gather_all([after(3, "a"), after(0, "b")]) == ["a", "b"]


async def pieces(texts: list[str], step: int) -> AsyncGenerator[Delta, None]:
    for text in texts:
        for _ in range(step):
            await asyncio.sleep(0)
        yield Delta(text)


async def test_interleaved_pieces_keep_each_streams_order_and_mark_its_end() -> None:
    seen = [
        (index, None if delta is None else delta.text)
        async for index, delta in interleave([pieces(["a1", "a2"], 3), pieces(["b1", "b2"], 1)])
    ]
    assert [text for index, text in seen if index == 0] == ["a1", "a2", None]
    assert [text for index, text in seen if index == 1] == ["b1", "b2", None]
    assert seen.index((1, "b1")) < seen.index((0, "a1"))  # the faster stream is not held


async def test_a_streams_failure_is_raised_and_the_others_are_closed() -> None:
    closed = asyncio.Event()

    async def failing() -> AsyncGenerator[Delta, None]:
        yield Delta("x")
        raise RuntimeError("replica died")

    async def endless() -> AsyncGenerator[Delta, None]:
        try:
            while True:
                await asyncio.sleep(0)
                yield Delta("y")
        finally:
            closed.set()

    with pytest.raises(RuntimeError, match="replica died"):
        async for _ in interleave([failing(), endless()]):
            pass
    assert closed.is_set()
