"""Tool calls read from generated text, whole and streamed (hermes, llama3_json)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.inference.tool_parsers import TOOL_PARSERS, Parsed, ToolParser

HERMES = TOOL_PARSERS["hermes"]
LLAMA3 = TOOL_PARSERS["llama3_json"]

WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2], "opts": {}}}'
TIME = '{"name": "get_time", "arguments": {"tz": "UTC"}}'
HERMES_ANSWERS = [
    "Let me check.\n<tool_call>\n" + WEATHER + "\n</tool_call>",
    "<tool_call>\n" + WEATHER + "\n</tool_call>\n<tool_call>\n" + TIME + "\n</tool_call>",
    "No tools needed: it is sunny {as always}.",
    "<tool_call>\n" + WEATHER[:-10],  # cut off by max_tokens
    "<tool_call>not json</tool_call> and text",
]


def streamed(parser: ToolParser, pieces: list[str]) -> tuple[str, list[tuple[str, str]]]:
    """Content and (name, arguments) per call, from an answer fed in `pieces`."""
    stream = parser.stream()
    out = Parsed()
    for piece in pieces:
        out.add(stream.feed(piece))
    out.add(stream.close())
    names: dict[int, str] = {}
    arguments: dict[int, str] = {}
    ids: dict[int, str] = {}
    for fragment in out.calls:
        if fragment.name is not None:
            assert fragment.index not in names, "a call's header is sent once"
            assert fragment.id is not None
            names[fragment.index], ids[fragment.index] = fragment.name, fragment.id
        assert fragment.index in names, "arguments come after their call's header"
        arguments[fragment.index] = arguments.get(fragment.index, "") + fragment.arguments
    calls = [(names[i], arguments.get(i, "")) for i in sorted(names)]
    return out.content, calls


def split(text: str, sizes: list[int]) -> list[str]:
    """`text` in pieces of `sizes`, and the rest."""
    pieces, position = [], 0
    for size in sizes:
        pieces.append(text[position : position + size])
        position += size
    return [*pieces, text[position:]]


def whole(parser: ToolParser, text: str) -> tuple[str, list[tuple[str, str]]]:
    content, calls = parser.parse(text)
    return content, [(c.name, c.arguments) for c in calls]


def test_hermes_reads_calls_and_keeps_the_text_around_them() -> None:
    content, calls = HERMES.parse(HERMES_ANSWERS[0])
    assert content == "Let me check."
    (call,) = calls
    assert call.name == "get_weather" and call.id.startswith("call_") and len(call.id) == 29
    assert json.loads(call.arguments) == {"city": "Paris", "days": [1, 2], "opts": {}}
    _, two = HERMES.parse(HERMES_ANSWERS[1])
    assert [c.name for c in two] == ["get_weather", "get_time"]


def test_an_unreadable_call_stays_text() -> None:
    assert HERMES.parse(HERMES_ANSWERS[4]) == (HERMES_ANSWERS[4], ())
    assert LLAMA3.parse('{"nam": "x"}') == ('{"nam": "x"}', ())
    assert LLAMA3.parse("Just text {not a call}") == ("Just text {not a call}", ())


def test_llama3_json_reads_one_or_more_calls() -> None:
    answer = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; ' + TIME
    content, calls = LLAMA3.parse(answer)
    assert content == ""
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}),
        ("get_time", {"tz": "UTC"}),
    ]


def test_streamed_fragments_come_as_the_text_arrives() -> None:
    stream = HERMES.stream()
    assert stream.feed("Let me check.\n<tool").content == "Let me check.\n"
    header = stream.feed('_call>\n{"name": "get_weather", "arguments": {"city": ')
    assert [(c.name, c.arguments) for c in header.calls] == [
        ("get_weather", ""),
        (None, '{"city": '),  # the arguments as far as they are written
    ]
    more = stream.feed('"Pa')
    assert "".join(c.arguments for c in more.calls) == '"Pa'
    # A `}` inside a string is text; the one that closes the arguments ends them ...
    last = stream.feed('ris}"}')
    assert "".join(c.arguments for c in last.calls) == 'ris}"}'
    # ... and the call object's own `}` is not arguments.
    end = stream.feed("}\n</tool_call>")
    assert "".join(c.arguments for c in end.calls) == ""


@pytest.mark.parametrize("answer", [a for a in HERMES_ANSWERS if a != HERMES_ANSWERS[3]])
def test_hermes_streamed_in_whole_gives_what_parse_gives(answer: str) -> None:
    assert normalized(streamed(HERMES, [answer])) == normalized(whole(HERMES, answer))


def test_a_call_cut_off_is_no_call_and_no_markup_whole_and_truncated_streamed() -> None:
    cut = HERMES_ANSWERS[3]
    # Whole: neither a call with broken arguments nor the raw `<tool_call>` text.
    assert whole(HERMES, "Let me see. " + cut) == ("Let me see. ", [])
    # Streamed: what was sent of it stays sent, and the stream says it was cut.
    stream = HERMES.stream()
    out = Parsed()
    for piece in (cut[:40], cut[40:]):
        out.add(stream.feed(piece))
    out.add(stream.close())
    assert stream.truncated
    assert out.content == ""
    arguments = "".join(c.arguments for c in out.calls)
    assert arguments == '{"city": "Paris", "days": [1, 2], "o'


def test_a_finished_call_is_not_truncated() -> None:
    stream = HERMES.stream()
    stream.feed(HERMES_ANSWERS[0])
    stream.close()
    assert not stream.truncated


@pytest.mark.parametrize("split_at", range(30, 50))
def test_streamed_arguments_begin_with_their_brace_wherever_the_text_is_split(
    split_at: int,
) -> None:
    answer = '<tool_call>\n{"name": "get_weather", "arguments":   {"city": "Paris"}}\n</tool_call>'
    _, calls = streamed(HERMES, [answer[:split_at], answer[split_at:]])
    assert calls == [("get_weather", '{"city": "Paris"}')]


def test_whole_arguments_are_the_json_the_model_wrote() -> None:
    answer = '<tool_call>\n{"name": "f", "arguments": {"a":1,"b":[2, 3]}}\n</tool_call>'
    _, calls = whole(HERMES, answer)
    assert calls == [("f", '{"a":1,"b":[2, 3]}')]
    assert streamed(HERMES, [answer])[1] == calls


def normalized(result: tuple[str, list[tuple[str, str]]]) -> tuple[str, list[tuple[str, object]]]:
    content, calls = result
    decoded: list[tuple[str, object]] = []
    for name, arguments in calls:
        try:
            decoded.append((name, json.loads(arguments)))
        except ValueError:
            decoded.append((name, arguments))
    return content.strip(), decoded


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(HERMES_ANSWERS[:3]), st.lists(st.integers(1, 12), max_size=40))
def test_hermes_any_split_gives_the_same_calls(answer: str, sizes: list[int]) -> None:
    pieces = split(answer, sizes)
    assert normalized(streamed(HERMES, pieces)) == normalized(whole(HERMES, answer))


LLAMA3_ANSWERS = [
    '{"name": "get_weather", "parameters": {"city": "Paris"}}',
    '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; ' + TIME,
    "The answer is 42.",
]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(LLAMA3_ANSWERS), st.lists(st.integers(1, 12), max_size=40))
def test_llama3_any_split_gives_the_same_calls(answer: str, sizes: list[int]) -> None:
    pieces = split(answer, sizes)
    assert normalized(streamed(LLAMA3, pieces)) == normalized(whole(LLAMA3, answer))


@pytest.mark.parametrize(("parser", "text"), [("hermes", "Sure. <too"), ("llama3_json", "<|pyth")])
@pytest.mark.parametrize("stream", [False, True])
async def test_an_answer_cut_inside_a_calls_opening_tag_has_no_markup_as_content(
    parser: str, text: str, stream: bool
) -> None:
    # At max_tokens 1 or 2 the model had written `<too`: that is a call begun, not text.
    from gateway.inference.types import Completion, Delta, Usage
    from gateway.upstream.tool_calls import read_completion, read_stream

    tools = TOOL_PARSERS[parser]
    expected = text[: text.index("<")]
    if not stream:
        whole = read_completion(tools, Completion(text, Usage(1, 2), "length"))
        assert (whole.text, whole.finish_reason) == (expected, "length")
        finished = read_completion(tools, Completion(text, Usage(1, 2), "stop"))
        assert finished.text == text  # not cut: the model ended its text so
        return

    async def pieces() -> AsyncIterator[Delta]:
        for index, char in enumerate(text):
            last = index == len(text) - 1
            yield Delta(text=char, output_tokens=1, finish_reason="length" if last else None)

    out = [delta async for delta in read_stream(tools, pieces())]
    assert "".join(delta.text for delta in out) == expected
    assert out[-1].finish_reason == "length"
