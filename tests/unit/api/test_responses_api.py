"""Responses API bodies onto the chat request, and its answer and events back."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.api.errors import APIError
from gateway.api.responses.responses_answers import ResponseStreamWriter, state_of
from gateway.api.responses.responses_requests import parse_responses
from gateway.inference.types import ChatMessage, ToolCall, ToolCallDelta, Usage

TOOL = {"type": "function", "name": "f", "parameters": {"type": "object"}}


def test_items_become_chat_messages_after_the_history() -> None:
    history = (ChatMessage("user", "earlier"), ChatMessage("assistant", "answer"))
    request = parse_responses(
        {
            "model": "m",
            "instructions": "Be brief.",
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                {"type": "function_call_output", "call_id": "c2", "output": "warm"},
                {"type": "reasoning", "summary": []},
            ],
            "tools": [TOOL],
            "tool_choice": {"type": "function", "name": "f"},
            "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}},
            "max_output_tokens": 7,
            "store": False,
            "metadata": {"k": "v"},
        },
        16,
        history,
    )
    calls = (ToolCall("c1", "f", "{}"), ToolCall("c2", "f", "{}"))
    assert request.messages == (
        ChatMessage("system", "Be brief."),
        *history,
        ChatMessage("user", "weather?"),
        ChatMessage("assistant", "", calls),  # calls made together: one turn
        ChatMessage("tool", "sunny", tool_call_id="c1"),
        ChatMessage("tool", "warm", tool_call_id="c2"),
    )
    assert (request.options.tool_choice, request.options.forced_tool) == ("required", "f")
    assert request.options.response_format is not None
    assert request.options.response_format.name == "w"
    assert request.params.max_tokens == 7
    state = state_of(request)
    assert (state.store, dict(state.metadata)) == (False, {"k": "v"})
    # The conversation a stored response keeps has no instructions.
    assert state.conversation == request.messages[1:]


def test_metadata_at_openais_caps_is_accepted() -> None:
    metadata = {f"{i:02d}" + "k" * 62: "v" * 512 for i in range(16)}
    request = parse_responses({"model": "m", "input": "hi", "metadata": metadata}, 16)
    assert dict(state_of(request).metadata) == metadata


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": []}, "input"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
        (
            {"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
            "input[0].call_id",
        ),
        (
            {"input": [{"type": "function_call_output", "call_id": "c9", "output": "x"}]},
            "input[0].call_id",
        ),
        ({"tools": [{"name": "f"}]}, "tools[0].type"),  # a tool of no type
        ({"tool_choice": "required"}, "tool_choice"),
        ({"metadata": {"k": 1}}, "metadata"),
        # Issue 40: 16 values of 60 KB each, kept 24 h with a stored response.
        ({"metadata": {f"k{i}": "x" * 60_000 for i in range(16)}}, "metadata"),
        ({"metadata": {"k": "x" * 513}}, "metadata"),
        ({"metadata": {"k" * 65: "v"}}, "metadata"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({"text": {"format": {"type": "xml"}}}, "text.format.type"),
    ],
)
def test_bad_input_is_refused_by_name(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(APIError) as caught:
        parse_responses({"model": "m", "input": "hi", **fields}, 16)
    assert caught.value.param == param


def events(raw: bytes) -> list[dict[str, Any]]:
    return [
        orjson.loads(block.split("\ndata: ", 1)[1]) for block in raw.decode().strip().split("\n\n")
    ]


def test_the_stream_numbers_its_events_and_ends_with_the_whole_response() -> None:
    request = parse_responses({"model": "m", "input": "hi", "tools": [TOOL]}, 16)
    writer = ResponseStreamWriter(request, "resp_1", "m", 3)
    raw = (
        writer.start()
        + writer.text("Let ")
        + writer.text("me.")
        + writer.tool_calls(
            (ToolCallDelta(0, "call_1", "f", ""), ToolCallDelta(0, arguments='{"a"'))
        )
        + writer.tool_calls((ToolCallDelta(0, arguments=": 1}"),))
        + writer.close("tool_calls", Usage(3, 9))
    )
    parsed = events(raw)
    assert [e["sequence_number"] for e in parsed] == list(range(len(parsed)))
    assert [e["type"] for e in parsed] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed",
    ]  # fmt: skip
    final = parsed[-1]["response"]
    # The answer's `tools` are JSON already (an `orjson.Fragment`), as the client sees them.
    assert final == orjson.loads(orjson.dumps(writer.answer()))
    assert final["status"] == "completed" and final["usage"]["total_tokens"] == 12
    message, call = final["output"]
    assert message["content"][0]["text"] == "Let me."
    assert (call["call_id"], call["arguments"], call["status"]) == (
        "call_1",
        '{"a": 1}',
        "completed",
    )


def test_an_answer_cut_at_its_limit_is_incomplete() -> None:
    writer = ResponseStreamWriter(parse_responses({"model": "m", "input": "hi"}, 16), "r", "m", 1)
    closing = events(writer.start() + writer.text("x") + writer.close("length", Usage(1, 16)))[-1]
    assert closing["type"] == "response.incomplete"
    assert closing["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
