"""Reading server-sent events (`gateway.backends.http.sse_payloads`) from aiohttp's own
stream reader, however the body is cut into reads: the same payloads as reading it line
by line with `readline`, which is what it replaced."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import pytest
from aiohttp.http_exceptions import LineTooLong
from aiohttp.streams import StreamReader
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.backends.http import sse_payloads

LIMIT = 2**16  # aiohttp's default; lines may reach twice that (the high-water mark)


class _Protocol:
    """The little of a connection's protocol a StreamReader calls."""

    _reading_paused = False

    def pause_reading(self, **_: object) -> None:
        pass

    def resume_reading(self, **_: object) -> None:
        pass


class _Response:
    def __init__(self, content: StreamReader) -> None:
        self.content = content


def _reader(pieces: list[bytes]) -> StreamReader:
    reader = StreamReader(_Protocol(), LIMIT, loop=asyncio.get_running_loop())  # type: ignore[arg-type]
    for piece in pieces:
        reader.feed_data(piece)
    reader.feed_eof()
    return reader


async def _by_readline(reader: StreamReader) -> AsyncIterator[bytes]:
    async for line in reader:
        if line.startswith(b"data:"):
            yield line[5:].strip()


async def _payloads(pieces: list[bytes]) -> list[bytes]:
    return [p async for p in sse_payloads(_Response(_reader(pieces)))]  # type: ignore[arg-type]


async def _reference(pieces: list[bytes]) -> list[bytes]:
    return [p async for p in _by_readline(_reader(pieces))]


def _cut(body: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(body) + 1) for c in cuts} | {0, len(body)})
    return [body[a:b] for a, b in itertools.pairwise(points) if b > a]


async def test_events_in_one_read_and_in_many() -> None:
    body = b'data: {"a":1}\n\ndata: {"a":2}\n\n: a comment\nevent: x\ndata: [DONE]\n\n'
    expected = [b'{"a":1}', b'{"a":2}', b"[DONE]"]
    assert await _payloads([body]) == expected
    assert await _payloads([bytes([b]) for b in body]) == expected


async def test_carriage_returns_and_a_last_line_without_its_newline() -> None:
    assert await _payloads([b"data: 1\r\n\r\ndata:2\r\n", b"data: 3"]) == [b"1", b"2", b"3"]
    assert await _payloads([]) == []
    assert await _payloads([b"\n\n"]) == []


@settings(max_examples=200, deadline=None)
@given(
    lines=st.lists(
        st.one_of(
            st.binary(max_size=20).map(lambda b: b"data:" + b.replace(b"\n", b"")),
            st.sampled_from([b"", b"\r", b": ping", b"event: x", b"data: [DONE]"]),
        ),
        max_size=12,
    ),
    ending=st.sampled_from([b"", b"\n"]),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8),
)
def test_same_payloads_as_line_by_line(lines: list[bytes], ending: bytes, cuts: list[int]) -> None:
    body = b"\n".join(lines) + ending
    pieces = _cut(body, cuts)

    async def both() -> tuple[list[bytes], list[bytes]]:
        return await _payloads(pieces), await _reference(pieces)

    ours, reference = asyncio.run(both())
    assert ours == reference


@pytest.mark.parametrize("newline", [True, False])
@pytest.mark.parametrize("split", [True, False])
async def test_a_line_over_the_buffer_limit_fails_as_readline_does(
    newline: bool, split: bool
) -> None:
    line = b"data: " + b"x" * (2 * LIMIT) + (b"\n" if newline else b"")
    pieces = [b"data: 1\n", *([line[:1000], line[1000:]] if split else [line])]
    # aiohttp's readline raised ValueError("Chunk too big") before 3.14; ours raises
    # LineTooLong on every release (the upstream's error maps to it, gateway.backends.http).
    with pytest.raises((LineTooLong, ValueError)):
        await _reference(pieces)
    ours: list[bytes] = []
    with pytest.raises(LineTooLong):
        async for payload in sse_payloads(_Response(_reader(pieces))):  # type: ignore[arg-type]
            ours.append(payload)
    assert ours == [b"1"]  # the lines before it came through
