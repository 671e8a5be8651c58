"""The Responses API's tools: function tools inside a `namespace` offered to the model
under names that cannot collide and answered as OpenAI does (`name` and `namespace`
apart, whole and streamed, and mapped back when a call returns in `input`); every tool
the models cannot run (hosted, unknown) left out and named, never silently; a
`tool_choice` that forces one, and malformed or oversized `tools`, a 400 naming the
field."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.api.body import MAX_TOOLS
from gateway.api.errors import APIError
from gateway.api.responses.responses_answers import (
    ResponseStreamWriter,
    conversation_after,
    response_body,
)
from gateway.api.responses.responses_requests import MAX_TOOL_ENTRIES, parse_responses
from gateway.inference.types import (
    ChatMessage,
    Completion,
    InferenceRequest,
    ToolCall,
    ToolCallDelta,
    Usage,
)

# The `tools` of Codex CLI 0.171.0's first request, as captured.
CODEX_TOOLS = json.loads((Path(__file__).parent / "codex_0.171.0_tools.json").read_text())


def function(name: str) -> dict[str, Any]:
    return {"type": "function", "name": name, "parameters": {"type": "object"}}


def namespace(name: str, *tools: dict[str, Any]) -> dict[str, Any]:
    return {"type": "namespace", "name": name, "description": "d", "tools": list(tools)}


def parse(tools: object, **fields: Any) -> InferenceRequest:
    return parse_responses({"model": "m", "input": "Hi", "tools": tools, **fields}, 16)


def refused(tools: object, **fields: Any) -> APIError:
    with pytest.raises(APIError) as caught:
        parse(tools, **fields)
    assert caught.value.status == 400
    return caught.value


def test_codex_cli_first_request_tools_parse() -> None:
    request = parse(CODEX_TOOLS, tool_choice="auto", parallel_tool_calls=True)
    names = [tool.name for tool in request.options.tools]
    assert names[:4] == ["exec_command", "write_stdin", "request_user_input", "view_image"]
    assert "multi_agent_v1__spawn_agent" in names and "spawn_agent" not in names
    assert request.omitted_tools == ("web_search",)
    assert request.options.tool_choice == "auto"


def test_namespace_functions_are_offered_under_names_that_cannot_collide() -> None:
    request = parse([namespace("a", function("get")), namespace("b", function("get"))])
    (first, second) = request.options.tools
    assert (first.name, second.name) == ("a__get", "b__get")
    assert first.parameters == {"type": "object"}
    assert request.omitted_tools == ()


@pytest.mark.parametrize(
    "kind",
    [
        "web_search", "web_search_2025_08_26", "web_search_preview", "file_search",
        "code_interpreter", "computer_use_preview", "computer", "mcp", "image_generation",
        "local_shell", "shell", "apply_patch", "tool_search", "programmatic_tool_calling",
        "a_type_from_next_year",
    ],
)  # fmt: skip
def test_every_tool_the_models_cannot_run_is_left_out_and_named(kind: str) -> None:
    request = parse([{"type": kind, "name": "x"}, function("f")])
    assert [tool.name for tool in request.options.tools] == ["f"]
    assert request.omitted_tools == (kind,)


def test_left_out_types_are_named_once_each_in_order() -> None:
    tools = [{"type": "web_search"}] * 50 + [{"type": "mcp"}, {"type": "shell"}]
    tools.append(namespace("ns", function("f")))
    request = parse(tools)
    assert request.omitted_tools == ("web_search", "mcp", "shell")
    assert [tool.name for tool in request.options.tools] == ["ns__f"]


def test_a_namespaced_call_is_answered_with_name_and_namespace() -> None:
    request = parse([function("top"), namespace("multi_agent_v1", function("spawn_agent"))])
    calls = (
        ToolCall("c1", "multi_agent_v1__spawn_agent", "{}"),
        ToolCall("c2", "top", "{}"),
    )
    completion = Completion("", Usage(3, 4), "tool_calls", calls)
    body = orjson.loads(response_body([request], [completion], response_id="r", model="m"))
    spawn, top = body["output"]
    assert (spawn["name"], spawn["namespace"]) == ("spawn_agent", "multi_agent_v1")
    assert top["name"] == "top" and "namespace" not in top
    # A stored response continues with the names the model knows.
    (*_, answer) = conversation_after(request, body)
    assert answer.tool_calls == calls


def test_a_streamed_namespaced_call_carries_its_namespace_in_every_event() -> None:
    request = parse([namespace("ns", function("f"))], stream=True)
    writer = ResponseStreamWriter(request, "r", "m", 0)
    writer.start()
    raw = writer.tool_calls((ToolCallDelta(0, "c1", "ns__f", '{"a":'),))
    raw += writer.tool_calls((ToolCallDelta(0, arguments=" 1}"),))
    raw += writer.close("tool_calls", Usage(1, 2))
    events = [orjson.loads(chunk.split(b"data: ", 1)[1]) for chunk in raw.split(b"\n\n") if chunk]
    items = [event["item"] for event in events if "item" in event]
    assert [(i["name"], i["namespace"]) for i in items] == [("f", "ns"), ("f", "ns")]
    (done,) = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert (done["name"], done["arguments"]) == ("f", '{"a": 1}')
    final = events[-1]["response"]["output"][0]
    assert (final["name"], final["namespace"]) == ("f", "ns")


def test_a_call_returned_in_input_with_its_namespace_maps_to_the_offered_tool() -> None:
    request = parse(
        [namespace("ns", function("f"))],
        input=[
            {"role": "user", "content": "Hi"},
            {"type": "function_call", "call_id": "c1", "name": "f", "namespace": "ns",
             "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        ],
    )  # fmt: skip
    assert request.messages[1] == ChatMessage("assistant", "", (ToolCall("c1", "ns__f", "{}"),))


@pytest.mark.parametrize("value", [7, "", ["ns"]])
def test_a_malformed_namespace_on_an_input_call_is_a_400(value: object) -> None:
    item = {"type": "function_call", "call_id": "c", "name": "f", "namespace": value,
            "arguments": "{}"}  # fmt: skip
    error = refused([], input=[item])
    assert error.param == "input[0].namespace"


@pytest.mark.parametrize(
    ("tool_choice", "tools"),
    [
        ({"type": "web_search_preview"}, [{"type": "web_search_preview"}, function("f")]),
        ({"type": "file_search"}, [function("f")]),
        ({"type": "mcp", "server_label": "deepwiki"}, [{"type": "mcp"}, function("f")]),
        ({"type": "shell"}, [{"type": "shell"}]),
        ({"type": "apply_patch"}, [{"type": "apply_patch"}, function("f")]),
        ({"type": "function", "name": "web_search"}, [{"type": "web_search"}, function("f")]),
        ("required", [{"type": "web_search"}]),
        ({"type": "x" * 10_000}, [function("f")]),
    ],
)
def test_tool_choice_forcing_a_left_out_tool_is_a_400(tool_choice: object, tools: object) -> None:
    error = refused(tools, tool_choice=tool_choice)
    assert error.param == "tool_choice"
    assert len(error.message) < 300  # a huge type is not repeated back


def test_tool_choice_may_force_a_namespaced_function() -> None:
    tools = [namespace("ns", function("f")), function("g")]
    by_flat_name = parse(tools, tool_choice={"type": "function", "name": "ns__f"})
    by_namespace = parse(tools, tool_choice={"type": "function", "name": "f", "namespace": "ns"})
    for request in (by_flat_name, by_namespace):
        assert request.options.forced_tool == "ns__f"
    assert refused(tools, tool_choice={"type": "function", "name": "f"}).param == "tool_choice.name"


@pytest.mark.parametrize(
    ("tools", "param"),
    [
        ("web_search", "tools"),
        ([None], "tools[0]"),
        ([{"name": "f"}], "tools[0].type"),
        ([{"type": 7}], "tools[0].type"),
        ([{"type": "web search\r\nx-evil: 1"}], "tools[0].type"),
        ([{"type": "é"}], "tools[0].type"),
        ([{"type": "t" * 65}], "tools[0].type"),
        ([function("f"), {"type": "namespace", "tools": [function("g")]}], "tools[1].name"),
        ([namespace("a.b", function("g"))], "tools[0].name"),
        ([namespace("n" * 65, function("g"))], "tools[0].name"),
        ([{"type": "namespace", "name": "ns", "tools": []}], "tools[0].tools"),
        ([{"type": "namespace", "name": "ns", "tools": {"f": {}}}], "tools[0].tools"),
        ([{**namespace("ns", function("g")), "description": 3}], "tools[0].description"),
        ([namespace("ns", function("f"), "f")], "tools[0].tools[1]"),
        # Namespaces do not nest, and hold no hosted tools (as OpenAI's).
        ([namespace("a", namespace("b", function("f")))], "tools[0].tools[0].type"),
        ([namespace("a", {"type": "web_search"})], "tools[0].tools[0].type"),
        ([namespace("ns", {"type": "function", "name": "bad name"})], "tools[0].tools[0].name"),
        ([namespace("ns", {"type": "function"})], "tools[0].tools[0].name"),
        ([namespace("ns", function("f" * 64))], "tools[0].tools[0].name"),
        ([namespace("ns", {**function("f"), "parameters": "x"})], "tools[0].tools[0].parameters"),
        ([namespace("ns", {**function("f"), "strict": "yes"})], "tools[0].tools[0].strict"),
        # Names that collide, however they are made.
        ([namespace("ns", function("f"), function("f"))], "tools[0].tools[1].name"),
        ([function("ns__f"), namespace("ns", function("f"))], "tools[1].tools[0].name"),
        (
            [namespace("a_", function("b")), namespace("a", function("_b"))],
            "tools[1].tools[0].name",
        ),
        ([function("f"), {"type": "web_search"}, function("f")], "tools[2].name"),
    ],
)  # fmt: skip
def test_malformed_tools_are_a_400_naming_the_field(tools: object, param: str) -> None:
    assert refused(tools).param == param


def test_huge_tool_lists_are_a_400_naming_tools() -> None:
    hosted = [{"type": "web_search"}] * (MAX_TOOL_ENTRIES + 1)
    functions = [function(f"f{i}") for i in range(MAX_TOOLS + 1)]
    spread = [namespace(f"n{i}", function("f")) for i in range(MAX_TOOLS + 1)]
    deep = [namespace("ns", *[function(f"f{i}") for i in range(MAX_TOOL_ENTRIES)])]
    for tools in (hosted, functions, spread, deep):
        assert refused(tools).param == "tools"
    # At the caps, they are taken.
    assert len(parse([function(f"f{i}") for i in range(MAX_TOOLS)]).options.tools) == MAX_TOOLS


def test_left_out_tools_are_logged_never_silently(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="gateway"):
        parse([{"type": "web_search"}, {"type": "mcp"}, function("f")])
        parse([function("f")])
    (line,) = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert "'m'" in line and line.endswith("web_search, mcp")


@pytest.mark.parametrize("text", [5, None, ["a"], {"t": 1}])
def test_an_output_part_whose_text_is_not_a_string_is_a_400(text: object) -> None:
    # It was a 500 and a traceback (joining a non-string).
    data = {
        "model": "m",
        "input": [
            {"role": "user", "content": "q"},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1",
             "output": [{"type": "input_text", "text": text}]},
        ],
    }  # fmt: skip
    with pytest.raises(APIError) as refused:
        parse_responses(data, 16)
    assert refused.value.status == 400 and refused.value.param == "input[2].output"


def test_an_empty_name_in_a_namespace_is_a_400() -> None:
    tools = [{"type": "namespace", "name": "ns", "description": "d",
              "tools": [{"type": "function", "name": ""}]}]  # fmt: skip
    with pytest.raises(APIError) as refused:
        parse_responses({"model": "m", "input": "q", "tools": tools}, 16)
    assert refused.value.param == "tools[0].tools[0].name"


def test_the_left_out_line_does_not_grow_with_what_the_client_sends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A 1 MB model name made a 1 MB log line per request.
    tools: list[dict[str, Any]] = [{"type": f"hosted_{i}"} for i in range(100)]
    with caplog.at_level(logging.INFO, logger="gateway"):
        parse_responses({"model": "gpt-" + "A" * 1_000_000, "input": "q", "tools": tools}, 16)
    (line,) = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(line) < 2_000 and line.endswith(" ...")


def test_the_item_the_token_limit_cut_is_incomplete_whole_and_streamed() -> None:
    # Codex CLI ran a cut call's arguments when its item said `completed`.
    request = parse([function("f")], stream=True)
    writer = ResponseStreamWriter(request, "r", "m", 0)
    raw = writer.start() + writer.tool_calls((ToolCallDelta(0, "c1", "f", '{"a": "cut sh'),))
    raw += writer.close("length", Usage(1, 2))
    events = [orjson.loads(chunk.split(b"data: ", 1)[1]) for chunk in raw.split(b"\n\n") if chunk]
    (done,) = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done["status"] == "incomplete"
    final = events[-1]
    assert final["type"] == "response.incomplete"
    assert final["response"]["output"][0]["status"] == "incomplete"
    # Whole: the cut call was left out; the text before it is the item cut.
    completion = Completion("Let me write", Usage(3, 4), "length")
    body = orjson.loads(response_body([parse([function("f")])], [completion], response_id="r",
                                      model="m"))  # fmt: skip
    assert body["status"] == "incomplete"
    assert body["output"][0]["status"] == "incomplete"


def test_the_left_out_header_names_at_most_16_types() -> None:
    # 512 types of 64 characters made a 33 KB header, past what proxies take.
    from gateway.serving.conductor import MAX_OMITTED_IN_HEADER, omitted_header

    many = tuple(f"hosted_{i:03d}_" + "x" * 52 for i in range(512))
    header = omitted_header(many)
    assert len(header) < 1_200 and header.endswith(", and 496 more")
    assert header.count("hosted_") == MAX_OMITTED_IN_HEADER
    assert omitted_header(("web_search", "mcp")) == "web_search, mcp"
