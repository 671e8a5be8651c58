"""Anthropic Messages bodies onto the chat request, and its answers and events back."""

from __future__ import annotations

import logging
from typing import Any

import orjson
import pytest

from gateway.api.anthropic.anthropic_answers import MessageStreamWriter, ratelimit_headers
from gateway.api.anthropic.anthropic_requests import parse_messages
from gateway.api.errors import APIError
from gateway.inference.types import ChatMessage, ToolCall, ToolCallDelta, Usage

USE = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}}
RESULT = {
    "type": "tool_result",
    "tool_use_id": "toolu_1",
    "content": [{"type": "text", "text": "ok"}],
}
TOOL = {"name": "f", "input_schema": {"type": "object"}}


def body(**fields: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "hi"}],
        **fields,
    }


def test_blocks_become_chat_messages() -> None:
    request = parse_messages(
        body(
            system=[{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
            messages=[
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": [{"type": "text", "text": "Let me see."}, USE]},
                {"role": "user", "content": [RESULT, {"type": "text", "text": "thanks"}]},
            ],
            tools=[TOOL],
            tool_choice={"type": "tool", "name": "f", "disable_parallel_tool_use": True},
            stop_sequences=["END"],
            metadata={"user_id": "u1"},
        ),
        16,
    )
    assert request.messages == (
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "weather?"),
        ChatMessage("assistant", "Let me see.", tool_calls=(ToolCall("toolu_1", "f", '{"a":1}'),)),
        ChatMessage("tool", "ok", tool_call_id="toolu_1"),
        ChatMessage("user", "thanks"),
    )
    options = request.options
    assert (options.tool_choice, options.forced_tool, options.parallel_tool_calls) == (
        "required",
        "f",
        False,
    )
    assert request.params.stop == ("END",) and request.user == "u1"
    assert request.params.max_tokens == request.requested_max_tokens == 8


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image"}]}]},
            "messages[0].content[0].type",
        ),
        ({"messages": [{"role": "user", "content": [USE]}]}, "messages[0].content[0].type"),
        (
            {"messages": [{"role": "user", "content": [RESULT]}]},
            "messages[0].content[0].tool_use_id",
        ),
        ({"tools": [{"name": "f"}]}, "tools[0].input_schema"),
        ({"tools": [{"name": "f g", "input_schema": {"type": "object"}}]}, "tools[0].name"),
        ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "tools[0].type"),
        ({"tool_choice": {"type": "any"}}, "tool_choice"),
        ({"tool_choice": {"type": "tool", "name": "g"}, "tools": [TOOL]}, "tool_choice.name"),
        ({"tool_choice": {"type": "tool", "name": ["f"]}, "tools": [TOOL]}, "tool_choice.name"),
        ({"tool_choice": {"type": "tool", "name": {"f": 1}}, "tools": [TOOL]}, "tool_choice.name"),
        (
            {"tool_choice": {"type": "auto", "disable_parallel_tool_use": "yes"}, "tools": [TOOL]},
            "tool_choice.disable_parallel_tool_use",
        ),
        (
            {"tools": [{"name": "f", "input_schema": {"$ref": "http://127.0.0.1:9/s.json"}}]},
            "tools[0].input_schema",
        ),
        ({"temperature": 1.5}, "temperature"),
        ({"top_k": 5}, "top_k"),
        ({"stop_sequences": ["a", ""]}, "stop_sequences"),
    ],
)
def test_bad_input_is_refused_by_name(fields: dict[str, Any], param: str) -> None:
    data = {k: v for k, v in body(**fields).items() if v is not None}
    with pytest.raises(APIError) as caught:
        parse_messages(data, 16)
    assert caught.value.param == param


def test_system_messages_stay_where_they_stand() -> None:
    # Claude Code's first request (mid-conversation-system beta): a user message with a
    # cached text block, then a system message last; beta fields beside them.
    cached = {"type": "text", "text": "go", "cache_control": {"type": "ephemeral"}}
    request = parse_messages(
        body(
            system=[{"type": "text", "text": "You are Claude Code.", "cache_control": {}}],
            messages=[
                {"role": "user", "content": [{"type": "text", "text": "Fix it. "}, cached]},
                {"role": "system", "content": "Agent types: ..."},
                {"role": "assistant", "content": "Done."},
                {"role": "system", "content": [{"type": "text", "text": "A"}, cached]},
            ],
            max_tokens=32000,
            thinking={"type": "adaptive"},
            context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            output_config={"effort": "high"},
        ),
        16,
    )
    assert request.messages == (
        ChatMessage("system", "You are Claude Code."),
        ChatMessage("user", "Fix it. go"),
        ChatMessage("system", "Agent types: ..."),
        ChatMessage("assistant", "Done."),
        ChatMessage("system", "Ago"),
    )


DROPPED = [
    {"type": "thinking", "thinking": "hm", "signature": "s"},
    {"type": "redacted_thinking", "data": "xx"},
    {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}},
    {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
    {"type": "some_future_block_2027", "payload": {"a": [[[[1]]]]}},
]


def test_an_earlier_answers_unreadable_blocks_are_dropped_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    answer = [*DROPPED * 20_000, {"type": "text", "text": "It is sunny."}]
    with caplog.at_level(logging.INFO, logger="gateway"):
        request = parse_messages(
            body(
                messages=[
                    {"role": "user", "content": "weather?"},
                    {"role": "assistant", "content": answer},
                    {"role": "user", "content": "thanks"},
                ]
            ),
            16,
        )
    assert request.messages[1] == ChatMessage("assistant", "It is sunny.")
    (line,) = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert line.endswith(
        "redacted_thinking, server_tool_use, some_future_block_2027, thinking, "
        "web_search_tool_result"
    )


def test_a_request_without_dropped_blocks_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="gateway"):
        parse_messages(body(), 16)
    assert not caplog.records


@pytest.mark.parametrize(
    ("role", "block", "param"),
    [
        # What the model is given to answer from: refused, not answered without.
        ("user", {"type": "image", "source": {}}, "messages[0].content[0].type"),
        ("user", {"type": "document", "source": {}}, "messages[0].content[0].type"),
        ("user", {"type": "search_result", "content": []}, "messages[0].content[0].type"),
        ("user", {"type": "container_upload", "file_id": "f"}, "messages[0].content[0].type"),
        ("user", {"type": "thinking", "thinking": "x"}, "messages[0].content[0].type"),
        ("system", {"type": "image", "source": {}}, "messages[0].content[0].type"),
        ("system", {"type": "tool_result"}, "messages[0].content[0].type"),
        # A known block out of its place.
        ("assistant", {"type": "tool_result", "tool_use_id": "t"}, "messages[0].content[0].type"),
        # Malformed blocks, whichever the role: a 400 naming them, never a 5xx.
        ("assistant", {"type": ["thinking"]}, "messages[0].content[0].type"),
        ("assistant", {"type": {"x": 1}}, "messages[0].content[0].type"),
        ("assistant", {"type": 7}, "messages[0].content[0].type"),
        ("assistant", {"type": None}, "messages[0].content[0].type"),
        ("assistant", {}, "messages[0].content[0].type"),
        ("assistant", {"type": "t" * 1_000_000}, "messages[0].content[0].type"),
        ("assistant", {"type": "thinking\r\nx-evil: 1"}, "messages[0].content[0].type"),
        ("assistant", {"type": "Thinking"}, "messages[0].content[0].type"),
        ("assistant", {"type": ""}, "messages[0].content[0].type"),
        ("assistant", "thinking", "messages[0].content[0]"),
        ("assistant", [{"type": "text", "text": "x"}], "messages[0].content[0]"),
        ("user", {"type": "text", "text": ["x"]}, "messages[0].content[0].text"),
        ("system", {"type": "text", "text": None}, "messages[0].content[0].text"),
        ("system", "text", "messages[0].content[0].type"),
    ],
)
def test_blocks_the_model_would_need_or_malformed_ones_are_refused_by_name(
    role: str, block: Any, param: str
) -> None:
    with pytest.raises(APIError) as caught:
        parse_messages(body(messages=[{"role": role, "content": [block]}]), 16)
    assert caught.value.status == 400 and caught.value.param == param
    assert len(str(caught.value)) < 1_000  # a huge type is named, not echoed


@pytest.mark.parametrize(
    "content", [7, None, {"type": "text", "text": "x"}, [[{"type": "text", "text": "x"}]]]
)
def test_a_system_message_of_no_text_is_refused_by_name(content: Any) -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "system", "content": content}]
    with pytest.raises(APIError) as caught:
        parse_messages(body(messages=messages), 16)
    assert caught.value.status == 400
    assert caught.value.param is not None and caught.value.param.startswith("messages[1].content")


@pytest.mark.parametrize("value", [0, -1, -(10**30), "8", "", True, False, 1.5, [8], {"n": 8}])
def test_max_tokens_that_is_no_positive_integer_is_refused_by_name(value: Any) -> None:
    with pytest.raises(APIError) as caught:
        parse_messages(body(max_tokens=value), 16)
    assert caught.value.status == 400 and caught.value.param == "max_tokens"


def test_a_huge_max_tokens_is_left_to_the_models_limit() -> None:
    # Clamped or refused by the model's `max_tokens_policy` (serving/conductor.py).
    request = parse_messages(body(max_tokens=10**30), 16)
    assert request.params.max_tokens == request.requested_max_tokens == 10**30


def events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in raw.decode().strip().split("\n\n"):
        name, data = block.split("\n")
        out.append((name.removeprefix("event: "), orjson.loads(data.removeprefix("data: "))))
    return out


def test_the_stream_opens_and_closes_each_block_in_turn() -> None:
    writer = MessageStreamWriter(parse_messages(body(), 16), "msg_1", "m", 5)
    raw = (
        writer.start()
        + writer.text("Let ")
        + writer.text("me.")
        + writer.tool_calls(
            (ToolCallDelta(0, "call_1", "f", ""), ToolCallDelta(0, arguments='{"a"'))
        )
        + writer.tool_calls((ToolCallDelta(0, arguments=": 1}"),))
        + writer.close("tool_calls", Usage(5, 7))
    )
    names = [name for name, _ in events(raw)]
    assert names == [
        "message_start", "ping",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop",
    ]  # fmt: skip
    parsed = events(raw)
    assert parsed[0][1]["message"]["usage"] == {"input_tokens": 5, "output_tokens": 0}
    assert parsed[6][1] == {
        "type": "content_block_start",
        "index": 1,
        "content_block": {"type": "tool_use", "id": "call_1", "name": "f", "input": {}},
    }
    assert parsed[7][1]["delta"] == {"type": "input_json_delta", "partial_json": '{"a"'}
    assert parsed[10][1]["delta"]["stop_reason"] == "tool_use"
    assert parsed[10][1]["usage"] == {"input_tokens": 5, "output_tokens": 7}


def test_ratelimit_headers_say_when_the_bucket_is_full_again() -> None:
    headers = ratelimit_headers(
        {
            "x-ratelimit-limit-tokens": "60",
            "x-ratelimit-remaining-tokens": "10",
            "x-ratelimit-reset-tokens": "50s",
        }
    )
    assert headers["anthropic-ratelimit-tokens-limit"] == "60"
    assert headers["anthropic-ratelimit-tokens-remaining"] == "10"
    assert headers["anthropic-ratelimit-tokens-reset"].endswith("Z")
    assert "anthropic-ratelimit-requests-limit" not in headers


@pytest.mark.parametrize(
    ("pieces", "relayed"),
    [
        (["  ", ' {"a"', ": 1}"], ['{"a"', ": 1}"]),  # leading space: not the model's JSON
        (['"just a string"'], []),  # not an object: `input` stays {}, as a whole answer's
        (["[1, ", "2]"], []),
        (["  ", "  "], []),
    ],
)
def test_a_streamed_call_relays_its_arguments_only_as_an_object(
    pieces: list[str], relayed: list[str]
) -> None:
    writer = MessageStreamWriter(parse_messages(body(), 16), "msg_1", "m", 5)
    raw = writer.start() + writer.tool_calls((ToolCallDelta(0, "call_1", "f", ""),))
    for piece in pieces:
        raw += writer.tool_calls((ToolCallDelta(0, arguments=piece),))
    raw += writer.close("tool_calls", Usage(5, 7))
    deltas = [
        data["delta"]["partial_json"]
        for _, data in events(raw)
        if data.get("type") == "content_block_delta"
    ]
    assert deltas == relayed
    # What the anthropic SDK makes of the stream is the object a whole answer gives.
    text = "".join(deltas)
    assert isinstance(orjson.loads(text) if text else {}, dict)
