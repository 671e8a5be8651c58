"""Custom tools (free-form text input) and `additional_tools` input items, as Codex CLI
sends them with its default model: a custom tool is offered to the model as a function
of one string argument and its calls are answered as `custom_tool_call` items holding
that text, whole and streamed, and mapped back when they return in `input`; the tools
of an `additional_tools` item are offered as those of `tools`; every malformed value is
a 400 naming the field."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from gateway.api.errors import APIError
from gateway.api.responses.responses_answers import (
    ResponseStreamWriter,
    conversation_after,
    response_body,
)
from gateway.api.responses.responses_requests import (
    MAX_GRAMMAR_CHARS,
    MAX_TOOL_ENTRIES,
    parse_responses,
)
from gateway.inference.types import (
    ChatMessage,
    Completion,
    InferenceRequest,
    ToolCall,
    ToolCallDelta,
    Usage,
)

GRAMMAR = "start: SOURCE\nSOURCE: /[\\s\\S]+/\n"
EXEC = {
    "type": "custom",
    "name": "exec",
    "description": "Run JavaScript code.",
    "format": {"type": "grammar", "syntax": "lark", "definition": GRAMMAR},
}
WAIT = {"type": "function", "name": "wait", "parameters": {"type": "object"}}
USER = {"role": "user", "content": "q"}


def additional(*tools: dict[str, Any]) -> dict[str, Any]:
    return {"type": "additional_tools", "role": "developer", "tools": list(tools)}


def codex_like(**fields: Any) -> InferenceRequest:
    """Codex CLI 0.171.0's first request with its default model, in shape: its tools in
    an `additional_tools` item (a namespace whose main tool is custom), no `tools`."""
    functions = {"type": "namespace", "name": "functions", "description": "", "tools": [EXEC, WAIT]}
    data = {
        "model": "gpt-6.2-sol",
        "input": [
            additional(functions),
            {"type": "message", "role": "developer", "content": "Be brief."},
            {"type": "message", "role": "user", "content": "write hello.py"},
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "stream": True,
        **fields,
    }
    return parse_responses(data, 16)


def refused(data: dict[str, Any]) -> APIError:
    with pytest.raises(APIError) as caught:
        parse_responses({"model": "m", **data}, 16)
    assert caught.value.status == 400
    return caught.value


def test_additional_tools_and_custom_tools_are_offered_to_the_model() -> None:
    request = codex_like()
    exec_tool, wait = request.options.tools
    assert (exec_tool.name, wait.name) == ("functions__exec", "functions__wait")
    assert exec_tool.description == "Run JavaScript code."
    assert exec_tool.parameters is not None
    told = exec_tool.parameters["properties"]["input"]["description"]
    assert "lark grammar" in told and GRAMMAR in told
    assert exec_tool.parameters["required"] == ["input"]
    assert request.omitted_tools == ()
    # The item is not a message: the conversation is the developer and user turns.
    assert [m.role for m in request.messages] == ["system", "user"]


def test_a_custom_call_is_answered_as_a_custom_tool_call_with_its_text() -> None:
    request = codex_like(stream=False)
    code = 'await tools.exec_command({cmd: "echo hi"})\n'
    call = ToolCall("call_1", "functions__exec", orjson.dumps({"input": code}).decode())
    completion = Completion("", Usage(3, 4), "tool_calls", (call,))
    body = orjson.loads(response_body([request], [completion], response_id="r", model="m"))
    Response.model_validate(body)  # the SDK's own type
    (item,) = body["output"]
    assert item["type"] == "custom_tool_call"
    assert (item["name"], item["namespace"], item["input"]) == ("exec", "functions", code)
    assert item["call_id"] == "call_1"
    # A stored response continues with the call as the model made it.
    (*_, answer) = conversation_after(request, body)
    assert answer.tool_calls == (call,)


@pytest.mark.parametrize(
    "arguments",
    ['{"input": "x", "other": 1}', '{"input": 5}', '["input"]', '{"input": "cut sh'],
)
def test_a_custom_call_in_another_shape_keeps_what_the_model_wrote(arguments: str) -> None:
    request = codex_like(stream=False)
    call = ToolCall("c", "functions__exec", arguments)
    completion = Completion("", Usage(3, 4), "tool_calls", (call,))
    body = orjson.loads(response_body([request], [completion], response_id="r", model="m"))
    assert body["output"][0]["input"] == arguments


def test_a_streamed_custom_call_carries_its_text_in_custom_events() -> None:
    request = codex_like()
    writer = ResponseStreamWriter(request, "r", "m", 0)
    raw = writer.start()
    raw += writer.tool_calls((ToolCallDelta(0, "c1", "functions__exec", '{"input": "let a'),))
    raw += writer.tool_calls((ToolCallDelta(0, arguments=' = 1;"}'),))
    raw += writer.close("tool_calls", Usage(1, 2))
    adapter: TypeAdapter[ResponseStreamEvent] = TypeAdapter(ResponseStreamEvent)
    events = [
        adapter.validate_json(chunk.split(b"data: ", 1)[1]) for chunk in raw.split(b"\n\n") if chunk
    ]
    kinds = [event.type for event in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert "response.function_call_arguments.delta" not in kinds
    done = events[4]
    assert done.type == "response.custom_tool_call_input.done" and done.input == "let a = 1;"
    final = events[-1]
    assert final.type == "response.completed"
    (item,) = final.response.output
    assert item.type == "custom_tool_call" and item.input == "let a = 1;"


def test_custom_calls_and_their_outputs_in_input_map_to_the_offered_tool() -> None:
    request = codex_like(
        input=[
            additional({"type": "namespace", "name": "functions", "tools": [EXEC]}),
            {"role": "user", "content": "write hello.py"},
            {"type": "custom_tool_call", "call_id": "c1", "name": "exec",
             "namespace": "functions", "input": "text('hi')"},
            {"type": "custom_tool_call_output", "call_id": "c1",
             "output": [{"type": "input_text", "text": "hi"}]},
        ]
    )  # fmt: skip
    call = ToolCall("c1", "functions__exec", '{"input":"text(\'hi\')"}')
    assert request.messages[1:] == (
        ChatMessage("assistant", "", (call,)),
        ChatMessage("tool", "hi", tool_call_id="c1"),
    )


def test_tool_choice_may_force_a_custom_tool_by_its_type() -> None:
    tools = [{"type": "custom", "name": "patch"}, WAIT]
    request = parse_responses(
        {"model": "m", "input": "q", "tools": tools,
         "tool_choice": {"type": "custom", "name": "patch"}}, 16
    )  # fmt: skip
    assert request.options.forced_tool == "patch"
    # Forcing a custom tool as a function, or a function as custom, names the field.
    for choice in ({"type": "function", "name": "patch"}, {"type": "custom", "name": "wait"}):
        error = refused({"input": "q", "tools": tools, "tool_choice": choice})
        assert error.param == "tool_choice.name"


def test_a_free_text_custom_tool_is_told_so() -> None:
    request = parse_responses(
        {"model": "m", "input": "q", "tools": [{"type": "custom", "name": "note"}]}, 16
    )
    (tool,) = request.options.tools
    assert tool.parameters is not None
    assert "Free-form text" in tool.parameters["properties"]["input"]["description"]


@pytest.mark.parametrize(
    ("data", "param"),
    [
        # custom tools
        ({"tools": [{"type": "custom"}]}, "tools[0].name"),
        ({"tools": [{"type": "custom", "name": "a b"}]}, "tools[0].name"),
        ({"tools": [{"type": "custom", "name": "c", "format": "text"}]}, "tools[0].format.type"),
        ({"tools": [{"type": "custom", "name": "c", "format": {"type": "json"}}]},
         "tools[0].format.type"),
        ({"tools": [{"type": "custom", "name": "c",
                     "format": {"type": "grammar", "syntax": "pcre", "definition": "x"}}]},
         "tools[0].format"),
        ({"tools": [{"type": "custom", "name": "c",
                     "format": {"type": "grammar", "syntax": "lark", "definition": 5}}]},
         "tools[0].format"),
        ({"tools": [{"type": "custom", "name": "c", "format": {
            "type": "grammar", "syntax": "regex", "definition": "a" * (MAX_GRAMMAR_CHARS + 1)}}]},
         "tools[0].format.definition"),
        ({"tools": [{"type": "custom", "name": "c", "description": ["d"]}]},
         "tools[0].description"),
        ({"tools": [{"type": "custom", "name": "c"}, {"type": "function", "name": "c"}]},
         "tools[1].name"),
        # additional_tools items
        ({"input": [{"type": "additional_tools", "tools": {"a": 1}}, USER]}, "input[0].tools"),
        ({"input": [{"type": "additional_tools"}, USER]}, "input[0].tools"),
        ({"input": [{"type": "additional_tools", "role": "user", "tools": []}, USER]},
         "input[0].role"),
        ({"input": [additional({"type": "custom", "name": "c"}, {"type": "custom", "name": "c"}),
                    USER]},
         "input[0].tools[1].name"),
        ({"input": [additional({"type": 5}), USER]}, "input[0].tools[0].type"),
        ({"input": [additional({"type": "namespace", "name": "n", "tools": [{"type": "x"}]}),
                    USER]},
         "input[0].tools[0].tools[0].type"),
        ({"tools": [WAIT], "input": [additional(WAIT), USER]}, "input[0].tools[0].name"),
        # Only tools or reasoning in `input`: nothing to answer (it was a 500).
        ({"input": [additional({"type": "custom", "name": "a"})], "tools": [WAIT]}, "input"),
        ({"input": [{"type": "reasoning"}], "tools": [WAIT]}, "input"),
        # custom calls in input
        ({"input": [{"type": "custom_tool_call", "call_id": "c", "name": "n", "input": 5}]},
         "input[0].input"),
        ({"input": [{"type": "custom_tool_call", "call_id": "", "name": "n", "input": ""}]},
         "input[0].call_id"),
        ({"input": [{"type": "custom_tool_call_output", "call_id": "nope", "output": "x"}]},
         "input[0].call_id"),
    ],
)  # fmt: skip
def test_malformed_custom_tools_and_items_are_a_400_naming_the_field(
    data: dict[str, Any], param: str
) -> None:
    assert refused({"input": "q", **data}).param == param


def test_tool_entries_are_counted_across_tools_and_additional_items() -> None:
    half = [{"type": "web_search"}] * (MAX_TOOL_ENTRIES // 2 + 1)
    error = refused({"tools": half, "input": [additional(*half), {"role": "user", "content": "q"}]})
    assert error.param == "tools"
    many = [additional({"type": "web_search"}) for _ in range(MAX_TOOL_ENTRIES + 1)]
    assert refused({"input": [*many, {"role": "user", "content": "q"}]}).param == "tools"
