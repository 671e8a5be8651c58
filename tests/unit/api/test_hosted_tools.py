"""What a Responses answer echoes of its request's tools, and a stored response keeps
(issue 40): each tool's known fields only, an MCP tool's credentials never, the fields
the gateway does not check bounded; the same for `tool_choice` and `text.format`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.api.body import decode_json
from gateway.api.errors import APIError
from gateway.api.responses.hosted_tools import KNOWN_FIELDS, MAX_SETTINGS_BYTES
from gateway.api.responses.responses_answers import response_body
from gateway.api.responses.responses_requests import parse_responses
from gateway.api.tool_lists import ToolsJSON
from gateway.inference.types import Completion, Usage

CODEX_TOOLS = json.loads((Path(__file__).parent / "codex_0.171.0_tools.json").read_text())
JUNK = "x" * 500_000  # the finding's extra field: 500 KB


def answer(**fields: Any) -> dict[str, Any]:
    """The answer's JSON to a request with `fields`, as the client (and the store) gets it."""
    request = parse_responses({"model": "m", "input": "hi", **fields}, 16)
    completion = Completion("ok", usage=Usage(1, 1))
    body = response_body([request], [completion], response_id="resp_1", model="m")
    decoded: dict[str, Any] = orjson.loads(body)
    return decoded


def echoed_tools(tools: list[Any], as_text: bool = False) -> list[dict[str, Any]]:
    sent: object = ToolsJSON(orjson.dumps(tools)) if as_text else tools
    found: list[dict[str, Any]] = answer(tools=sent)["tools"]
    return found


def refused(**fields: Any) -> APIError:
    with pytest.raises(APIError) as caught:
        parse_responses({"model": "m", "input": "hi", **fields}, 16)
    assert caught.value.status == 400
    return caught.value


@pytest.mark.parametrize("as_text", [False, True])
def test_an_extra_field_of_a_hosted_tool_is_not_echoed(as_text: bool) -> None:
    web_search = {"type": "web_search", "search_context_size": "low", "padding": JUNK}
    [echoed] = echoed_tools([web_search], as_text)
    assert echoed == {"type": "web_search", "search_context_size": "low"}


def test_the_finding_s_attack_no_longer_reaches_the_answer() -> None:
    tools = [{"type": "web_search", f"pad{i}": JUNK} for i in range(1)] + [
        {"type": "function", "name": "f", "parameters": {"type": "object"}, "pad": JUNK}
    ]
    body = orjson.dumps(answer(tools=ToolsJSON(orjson.dumps(tools))))
    assert len(body) < 2_000


def test_an_mcp_tool_s_credentials_are_never_echoed() -> None:
    mcp = {
        "type": "mcp",
        "server_label": "deepwiki",
        "server_url": "https://mcp.example/mcp",
        "require_approval": "never",
        "authorization": "Bearer secret-token",
        "headers": {"X-Api-Key": "secret"},
    }
    [echoed] = echoed_tools([mcp])
    assert "authorization" not in echoed and "headers" not in echoed
    assert echoed["server_label"] == "deepwiki"
    assert echoed["require_approval"] == "never"


def test_a_tool_of_an_unknown_type_is_echoed_as_its_type() -> None:
    [echoed] = echoed_tools([{"type": "future_tool", "settings": {"a": JUNK}}])
    assert echoed == {"type": "future_tool"}


def test_function_custom_and_namespace_tools_keep_their_own_fields_only() -> None:
    tools = [
        {"type": "function", "name": "f", "description": "d", "strict": True,
         "parameters": {"type": "object"}, "junk": JUNK},
        {"type": "custom", "name": "c", "format": {"type": "grammar", "syntax": "lark",
         "definition": "start: /x/", "junk": JUNK}, "junk": JUNK},
        {"type": "namespace", "name": "ns", "junk": JUNK,
         "tools": [{"type": "function", "name": "g", "junk": JUNK}]},
    ]  # fmt: skip
    assert echoed_tools(tools) == [
        {"type": "function", "name": "f", "description": "d", "strict": True,
         "parameters": {"type": "object"}},
        {"type": "custom", "name": "c", "format": {"type": "grammar", "syntax": "lark",
         "definition": "start: /x/"}},
        {"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "g"}]},
    ]  # fmt: skip


def test_codex_cli_s_tools_are_echoed_whole() -> None:
    # A real client's tools hold no field the gateway drops.
    assert echoed_tools(CODEX_TOOLS, as_text=True) == CODEX_TOOLS


def test_every_hosted_type_of_the_sdk_keeps_its_known_fields() -> None:
    for kind, known in KNOWN_FIELDS.items():
        if kind in ("function", "custom", "namespace"):
            continue
        tool = {name: "v" for name in known} | {"type": kind, "extra": 1}
        [echoed] = echoed_tools([tool])
        assert echoed == {name: "v" for name in known} | {"type": kind}


@pytest.mark.parametrize(
    "tool",
    [
        # huge: a known field past the cap
        {"type": "file_search", "vector_store_ids": ["vs_" + "x" * 60] * 1000},
        {"type": "web_search", "filters": {"allowed_domains": [JUNK]}},
        {"type": "mcp", "server_label": "s", "server_description": JUNK},
        # a function's own unchecked fields are bounded too
        {"type": "function", "name": "f", "output_schema": {"d": JUNK}},
    ],
)
def test_a_hosted_tool_past_its_settings_cap_is_a_400_naming_it(tool: dict[str, Any]) -> None:
    error = refused(tools=[tool])
    assert error.param == "tools[0]"
    assert str(MAX_SETTINGS_BYTES) in error.message


@pytest.mark.parametrize(
    "value",
    [
        "a string where an object goes",
        12,
        None,
        [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["deep"]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]],
        {"nested": {"nested": {"nested": {"nested": "x" * 1000}}}},
    ],
)
def test_a_known_field_of_a_wrong_type_or_deep_is_echoed_within_the_cap(value: object) -> None:
    # The gateway runs no hosted tool: their settings are echoed as sent, bounded.
    [echoed] = echoed_tools([{"type": "web_search", "filters": value}])
    assert echoed == {"type": "web_search", "filters": value}


def test_a_deep_tool_past_the_body_s_depth_is_still_a_400() -> None:
    deep: object = "x"
    for _ in range(200):
        deep = [deep]
    body = {"model": "m", "input": "hi", "tools": [{"type": "web_search", "filters": deep}]}
    with pytest.raises(APIError) as caught:
        parse_responses(decode_json(orjson.dumps(body)), 16)
    assert caught.value.status == 400


def test_tool_choice_and_text_format_are_echoed_without_extra_fields() -> None:
    echoed = answer(
        tools=[{"type": "function", "name": "f"}],
        tool_choice={"type": "function", "name": "f", "junk": JUNK, "namespace": [JUNK]},
        text={"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"},
                         "junk": JUNK, "description": {"d": JUNK}}},
    )  # fmt: skip
    assert echoed["tool_choice"] == {"type": "function", "name": "f"}
    assert echoed["text"] == {
        "format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}}
    }
