"""A JSON request body read, for every wire: the body decoded (depth-checked, `tools` left
as text for the tool cache), and the fields the APIs share (integers, numbers, booleans,
function tools, `response_format`, tool results), each a 400 naming the field at fault."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
import orjson

from gateway.api.errors import bad_request
from gateway.api.tool_lists import ToolsJSON
from gateway.inference.schemas import SchemaRefused, check_schema
from gateway.inference.types import (
    ChatMessage,
    InferenceRequest,
    ResponseFormat,
    Tool,
    ToolList,
)

# A body parser: (the request body, the model's default max_tokens) -> the request.
Parser = Callable[[Mapping[str, Any], int], InferenceRequest]
MAX_STOP = 4


# How deeply a request body may nest objects and arrays. Far above what any API here
# needs (a tool's schema has caps of its own, `server.json_schema`), far below where
# recursive code (templates, JSON encoders, validators) would exhaust the stack: no
# body can turn into a RecursionError and a 500.
MAX_JSON_DEPTH = 128


# The top level of a body with tools: its values as JSON text, each parsed in turn but
# `tools`, left to the tool cache (`tool_lists.ToolsJSON`).
_TOP_LEVEL = msgspec.json.Decoder(dict[str, msgspec.Raw])
_TOO_DEEP = f"The request body nests objects and arrays more than {MAX_JSON_DEPTH} levels deep."


def decode_json(body: bytes) -> Mapping[str, Any]:
    """The JSON object in a request body, or a 400. A top-level `tools` stays its JSON
    text (`ToolsJSON`): an agent sends the same tools every turn, and the tool cache
    parses a list it has not seen (`tools_value`)."""
    if b'"tools"' in body:
        data = _decode_deferring_tools(body)
    else:
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise bad_request(f"The request body is not valid JSON: {exc}.") from None
        if not isinstance(data, dict):
            raise bad_request("The request body must be a JSON object.")
    # A level takes two bytes at least (`[]`): a short body cannot nest past the cap.
    # (Counting brackets to skip the walk cost more than the walk: 30 µs on 60 KB.)
    if len(body) > 2 * MAX_JSON_DEPTH and too_deep(data):
        raise bad_request(_TOO_DEEP)
    return data


def _decode_deferring_tools(body: bytes) -> dict[str, Any]:
    try:
        fields = _TOP_LEVEL.decode(body)
    except msgspec.ValidationError:  # valid JSON, not an object
        raise bad_request("The request body must be a JSON object.") from None
    except msgspec.DecodeError as exc:
        raise bad_request(f"The request body is not valid JSON: {exc}.") from None
    except RecursionError:  # msgspec's own bound (1,000 levels), past ours
        raise bad_request(_TOO_DEEP) from None
    data: dict[str, Any] = {}
    for name, raw in fields.items():
        text = memoryview(raw)
        if name == "tools":
            data[name] = (
                None
                if len(text) == 4 and text == memoryview(b"null")
                else ToolsJSON(text.tobytes())
            )
            continue
        try:
            data[name] = orjson.loads(text)
        except orjson.JSONDecodeError as exc:  # JSON orjson does not take (400 digits)
            raise bad_request(f"The request body is not valid JSON: `{name}`: {exc}.") from None
    return data


def tools_value(raw: object) -> object:
    """A top-level `tools` as the value it holds: parsed, and its depth checked, when
    the body left it as JSON text (a level below the body's own)."""
    if not isinstance(raw, ToolsJSON):
        return raw
    try:
        value = orjson.loads(raw.text)
    except orjson.JSONDecodeError as exc:  # JSON orjson does not take (400 digits)
        raise bad_request(f"The request body is not valid JSON: `tools`: {exc}.", "tools") from None
    if isinstance(value, list | dict) and too_deep(value, MAX_JSON_DEPTH - 1):
        raise bad_request(_TOO_DEEP)
    return value


def too_deep(data: dict[str, Any] | list[Any], limit: int = MAX_JSON_DEPTH) -> bool:
    # Level by level, so that the check itself cannot run out of stack.
    level: list[dict[str, Any] | list[Any]] = [data]
    for _ in range(limit):
        deeper: list[dict[str, Any] | list[Any]] = []
        for node in level:
            for child in node.values() if type(node) is dict else node:
                if type(child) is dict or type(child) is list:
                    deeper.append(child)
        if not deeper:
            return False
        level = deeper
    return True


def requested_model(data: Mapping[str, Any]) -> str:
    """The `model` field, which routing needs before the rest is parsed."""
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("`model` is required and must be a string.", "model")
    return model


# OpenAI's rule for function names.
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_TOOLS = 128


def parse_tools(raw: object) -> tuple[Tool, ...]:
    """`tools`: function definitions, each with a unique name and an object schema."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > MAX_TOOLS:
        raise bad_request(f"`tools` must be an array of at most {MAX_TOOLS} tools.", "tools")
    tools = []
    names: set[str] = set()
    for index, entry in enumerate(raw):
        where = f"tools[{index}]"
        if not isinstance(entry, dict) or entry.get("type") != "function":
            raise bad_request(f'`{where}.type` must be "function".', f"{where}.type")
        function = entry.get("function")
        if not isinstance(function, dict):
            raise bad_request(f"`{where}.function` must be an object.", f"{where}.function")
        name = function.get("name")
        if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
            raise bad_request(
                f"`{where}.function.name` must be 1 to 64 letters, digits, `_` or `-`.",
                f"{where}.function.name",
            )
        if name in names:
            raise bad_request(
                f"`{where}.function.name`: `{name}` is defined twice.", f"{where}.function.name"
            )
        names.add(name)
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise bad_request(
                f"`{where}.function.description` must be a string.",
                f"{where}.function.description",
            )
        parameters = function.get("parameters")
        if parameters is not None:
            check_json_schema(parameters, f"{where}.function.parameters")
        strict = function.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise bad_request(
                f"`{where}.function.strict` must be a boolean.", f"{where}.function.strict"
            )
        tools.append(Tool(name, description, parameters, strict))
    return ToolList(tools)


def check_json_schema(schema: object, param: str, *, compile_patterns: bool = False) -> None:
    """A 400 naming `param` unless `schema` is an object and a valid JSON Schema within
    the caps (`gateway.inference.schemas`); with `compile_patterns`, one the gateway can
    validate answers against."""
    if not isinstance(schema, dict):
        raise bad_request(f"`{param}` must be a JSON Schema object.", param)
    try:
        check_schema(schema, compile_patterns=compile_patterns)
    except SchemaRefused as exc:
        raise bad_request(f"`{param}` is not accepted as a JSON Schema: {exc}", param) from None


def parse_response_format(raw: object) -> ResponseFormat | None:
    """`response_format`: None for text (the default), else what JSON is wanted."""
    if raw is None:
        return None
    kind = raw.get("type") if isinstance(raw, dict) else None
    if not isinstance(raw, dict) or kind not in ("text", "json_object", "json_schema"):
        raise bad_request(
            '`response_format.type` must be "text", "json_object" or "json_schema".',
            "response_format.type",
        )
    if kind == "text":
        return None
    if kind == "json_object":
        return ResponseFormat("json_object")
    spec = raw.get("json_schema")
    if not isinstance(spec, dict):
        raise bad_request(
            "`response_format.json_schema` must be an object with `name` and `schema`.",
            "response_format.json_schema",
        )
    name = spec.get("name")
    if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
        raise bad_request(
            "`response_format.json_schema.name` must be 1 to 64 letters, digits, `_` or `-`.",
            "response_format.json_schema.name",
        )
    schema = spec.get("schema", {"type": "object"})
    check_json_schema(schema, "response_format.json_schema.schema", compile_patterns=True)
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise bad_request(
            "`response_format.json_schema.strict` must be a boolean.",
            "response_format.json_schema.strict",
        )
    description = spec.get("description")
    return ResponseFormat("json_schema", name, schema, strict, description)


def check_tool_results(
    messages: tuple[ChatMessage, ...], places: Mapping[str, str] | None = None
) -> None:
    """Every `tool` message answers a call an earlier assistant message made; a 400
    naming the result's place (`places[call id]`, else its chat message's)."""
    called: set[str] = set()
    for index, message in enumerate(messages):
        called.update(call.id for call in message.tool_calls)
        if message.tool_call_id is not None and message.tool_call_id not in called:
            where = (places or {}).get(message.tool_call_id, f"messages[{index}].tool_call_id")
            raise bad_request(
                f"`{where}`: no earlier assistant message made a call with the id "
                f"`{message.tool_call_id}`.",
                where,
            )


def optional_int(
    data: Mapping[str, Any], name: str, minimum: int | None = None, maximum: int | None = None
) -> int | None:
    value = data.get(name)
    if value is None:
        return None
    # bool is an int in Python; a JSON `true` is not a number.
    if not isinstance(value, int) or isinstance(value, bool):
        raise bad_request(f"`{name}` must be an integer.", name)
    if maximum is not None and minimum is not None and not minimum <= value <= maximum:
        raise bad_request(f"`{name}` must be between {minimum} and {maximum}.", name)
    if minimum is not None and value < minimum:
        raise bad_request(f"`{name}` must be at least {minimum}.", name)
    return value


def optional_float(data: Mapping[str, Any], name: str, low: float, high: float) -> float | None:
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise bad_request(f"`{name}` must be a number.", name)
    if not low <= value <= high:
        raise bad_request(f"`{name}` must be between {low:g} and {high:g}.", name)
    return float(value)


def optional_bool(data: Mapping[str, Any], name: str, param: str | None = None) -> bool | None:
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise bad_request(f"`{param or name}` must be a boolean.", param or name)
    return value
