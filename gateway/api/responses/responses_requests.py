"""Parse OpenAI Responses API bodies (`POST /v1/responses`) into `InferenceRequest`.

`input` (a text, or items: messages with text parts, function and custom tool calls and
their outputs) becomes chat messages after the stored conversation of
`previous_response_id`, with `instructions` as the system message (not carried over
from the previous response, as OpenAI does). Function tools, `tool_choice` and
`text.format` map onto the chat options. What the answer must echo (metadata, store,
the tools as sent) rides along as the request's `wire_state`. `reasoning` is accepted
and ignored: the models served here do not reason.

Tools: function tools are offered to the model as they are; the function tools of a
`namespace` tool too, each under the name `<namespace>__<name>` (`__`: the internal name
rule has no `.`), so that two namespaces' same names cannot collide; a call of one is
answered as OpenAI does, with `name` and `namespace` apart. A `custom` tool (free-form
text input, which the client runs) is offered as a function of one string argument,
`input`, its format (a grammar, say) told in that argument's description; a call of it
is answered as a `custom_tool_call` with that text. The tools of an `additional_tools`
input item (Codex CLI sends its tools so) are offered as those of `tools`. Every other
tool type (the hosted tools: web search, file search, MCP, shells, ...; types the
gateway does not know) is left out: no model here can run it. The request names what it
left out (`InferenceRequest.omitted_tools`), which the answer's `x-gateway-omitted-tools`
header says; a `tool_choice` that forces one is a 400.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.api.body import (
    MAX_TOOLS,
    check_tool_results,
    optional_bool,
    optional_float,
    optional_int,
    parse_response_format,
    parse_tools,
    requested_model,
    tools_value,
)
from gateway.api.errors import APIError, bad_request, renamed
from gateway.api.responses.hosted_tools import echoed_tool
from gateway.api.tool_lists import ToolListCache, key_of
from gateway.inference.types import (
    ChatMessage,
    ChatOptions,
    InferenceRequest,
    RequestKind,
    ResponseFormat,
    SamplingParams,
    Tool,
    ToolCall,
)

MAX_METADATA = 16
# OpenAI's caps on one metadata entry: a stored response keeps it for its lifetime, so
# without them one tenant's `store: true` fills the Redis every limit lives in.
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512
# Entries of `tools`, namespaces' included, walked at most: the function tools among them
# are capped by `MAX_TOOLS` as chat's are; this bounds the hosted ones left out.
MAX_TOOL_ENTRIES = 4 * MAX_TOOLS
# How a namespace's function is named to the model: `<namespace>__<name>`.
NAMESPACE_SEPARATOR = "__"
# A tool type or namespace name as the gateway repeats it (in a header, a log line):
# nothing a header could not carry.
_TOOL_TYPE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_NAMESPACE = re.compile(r"[A-Za-z0-9_-]{1,64}")
# A custom tool's text, as the model writes it: the one argument of a function.
CUSTOM_INPUT = "input"
# A custom tool's grammar, told to the model, at most (Codex's is 200 characters).
MAX_GRAMMAR_CHARS = 16_384

log = logging.getLogger("gateway")


@dataclass(frozen=True, slots=True)
class ResponsesState:
    """What a Responses answer echoes of its request, and what storing it needs."""

    instructions: str | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    store: bool = True
    previous_response_id: str | None = None
    # The request's tools, tool_choice and text format as the answer shows them (the
    # tools as the client's JSON text, when the body decoder left them so).
    tools: Sequence[Mapping[str, Any]] | orjson.Fragment = ()
    tool_choice: Any = "auto"
    # A namespace's functions, by the name the model knows them by: (namespace, name).
    namespaced: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    # The custom tools, by the name the model knows them by: their calls are answered as
    # `custom_tool_call` items.
    custom: frozenset[str] = frozenset()
    text_format: Mapping[str, Any] = field(default_factory=lambda: {"type": "text"})
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = None
    # The conversation without the instructions: what a stored response keeps.
    conversation: tuple[ChatMessage, ...] = ()


def parse_responses(
    data: Mapping[str, Any],
    default_max_tokens: int,
    history: Sequence[ChatMessage] = (),
    session: str | None = None,
) -> InferenceRequest:
    """A `/v1/responses` body, continuing `history` (the previous response's
    conversation, when `previous_response_id` names one) and its `session`."""
    raw_input = data.get("input")
    conversation = (*history, *_input(raw_input))
    check_tool_results(conversation, _output_places(raw_input))
    instructions = data.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad_request("`instructions` must be a string.", "instructions")
    messages = conversation
    if instructions:
        messages = (ChatMessage("system", instructions), *conversation)
    if not messages:  # only reasoning or additional_tools items: nothing to answer
        raise bad_request(
            "`input` holds no message, call or call output, and there are no `instructions`.",
            "input",
        )
    raw_tools = data.get("tools")
    lists = list(_tool_lists(raw_tools, raw_input))
    offered, tools = _TOOLS.lookup(_lists_key(lists), lists)
    if offered.omitted:
        # Never silently: the answer's header says it too.
        # The model as sent, cut short: a client chooses its length (1 MB made 1 MB lines).
        log.info(
            "responses: tools left out for model %r (no model here runs them): %s",
            requested_model(data)[:100],
            ", ".join(offered.omitted[:20]) + (" ..." if len(offered.omitted) > 20 else ""),
        )
    choice, forced = _tool_choice(
        data.get("tool_choice"), {tool.name for tool in tools}, offered.custom, offered.omitted
    )
    parallel = optional_bool(data, "parallel_tool_calls")
    text = data.get("text")
    if text is not None and not isinstance(text, dict):
        raise bad_request("`text` must be an object.", "text")
    text_format = (text or {}).get("format")
    response_format = _response_format(text_format)
    max_tokens = optional_int(data, "max_output_tokens", minimum=1)
    user = data.get("user")
    if user is not None and not isinstance(user, str):
        raise bad_request("`user` must be a string.", "user")
    previous = data.get("previous_response_id")
    state = ResponsesState(
        instructions=instructions,
        metadata=_metadata(data.get("metadata")),
        store=optional_bool(data, "store") is not False,
        previous_response_id=previous if isinstance(previous, str) else None,
        tools=offered.echo,
        tool_choice=_echoed_choice(data.get("tool_choice")),
        namespaced=offered.namespaced,
        custom=frozenset(offered.custom),
        text_format=_echoed_format(text_format),
        parallel_tool_calls=parallel is not False,
        max_output_tokens=max_tokens,
        conversation=conversation,
    )
    return InferenceRequest(
        kind=RequestKind.CHAT,
        model=requested_model(data),
        params=SamplingParams(
            max_tokens=max_tokens or default_max_tokens,
            temperature=optional_float(data, "temperature", 0.0, 2.0),
            top_p=optional_float(data, "top_p", 0.0, 1.0),
        ),
        stream=optional_bool(data, "stream") or False,
        messages=messages,
        requested_max_tokens=max_tokens,
        user=user,
        options=ChatOptions(
            tools=tools,
            tool_choice=choice,
            forced_tool=forced,
            parallel_tool_calls=parallel if tools else None,
            response_format=response_format,
        ),
        wire_state=state,
        session=session,
        omitted_tools=offered.omitted,
    )


def _output_places(raw: object) -> dict[str, str]:
    """Where each function call output sits in `input`, by its call id."""
    places = {}
    for index, item in enumerate(raw if isinstance(raw, list) else []):
        if isinstance(item, dict) and item.get("type") in _OUTPUTS:
            places[str(item.get("call_id"))] = f"input[{index}].call_id"
    return places


def _input(raw: object) -> list[ChatMessage]:
    if isinstance(raw, str):
        return [ChatMessage("user", raw)]
    if not isinstance(raw, list) or not raw:
        raise bad_request("`input` must be a string or a non-empty array of items.", "input")
    messages: list[ChatMessage] = []
    for index, item in enumerate(raw):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise bad_request(f"`{where}` must be an object.", where)
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(item, where))
        elif kind in ("function_call", "custom_tool_call"):
            call = (
                _function_call(item, where)
                if kind == "function_call"
                else _custom_call(item, where)
            )
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant" and not last.content:
                # Calls made together come as consecutive items: one assistant turn.
                messages[-1] = ChatMessage("assistant", "", (*last.tool_calls, call))
            else:
                messages.append(ChatMessage("assistant", "", (call,)))
        elif kind in _OUTPUTS:
            messages.append(_function_output(item, where))
        elif kind == "additional_tools":
            continue  # its tools: read and checked with `tools` (`_tool_lists`)
        elif kind == "reasoning":
            continue  # a reasoning model's earlier thoughts: not for these models
        else:
            raise bad_request(
                f"`{where}.type` {kind!r} is not supported (message, function_call, "
                "function_call_output, custom_tool_call, custom_tool_call_output, "
                "additional_tools, reasoning).",
                f"{where}.type",
            )
    return messages


_OUTPUTS = ("function_call_output", "custom_tool_call_output")
_ROLES = ("user", "assistant", "system", "developer")
_TEXT_PARTS = ("input_text", "output_text", "text")


def _message(item: dict[str, Any], where: str) -> ChatMessage:
    role = item.get("role")
    if role not in _ROLES:
        raise bad_request(f"`{where}.role` must be one of {', '.join(_ROLES)}.", f"{where}.role")
    content = item.get("content")
    if isinstance(content, list):
        texts = []
        for number, part in enumerate(content):
            at = f"{where}.content[{number}]"
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
                raise bad_request(
                    f"`{at}.type` {kind!r} is not supported: only text parts are.", f"{at}.type"
                )
            texts.append(part["text"])
        content = "".join(texts)
    if not isinstance(content, str):
        raise bad_request(
            f"`{where}.content` must be a string or an array of text parts.", f"{where}.content"
        )
    return ChatMessage("system" if role == "developer" else role, content)


def _function_call(item: dict[str, Any], where: str) -> ToolCall:
    call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
    for field_name, value in (("call_id", call_id), ("name", name)):
        if not isinstance(value, str) or not value:
            raise bad_request(
                f"`{where}.{field_name}` must be a non-empty string.", f"{where}.{field_name}"
            )
    if not isinstance(arguments, str):
        raise bad_request(
            f"`{where}.arguments` must be a string (JSON text).", f"{where}.arguments"
        )
    namespace = item.get("namespace")
    if namespace is not None:
        if not isinstance(namespace, str) or not namespace:
            raise bad_request(
                f"`{where}.namespace` must be a non-empty string.", f"{where}.namespace"
            )
        # The name the model knows a namespace's function by (`_offered_tools`).
        name = f"{namespace}{NAMESPACE_SEPARATOR}{name}"
    return ToolCall(str(call_id), str(name), arguments)


def _custom_call(item: dict[str, Any], where: str) -> ToolCall:
    """A custom tool call as the function call the model made (`_offer_custom`)."""
    text = item.get("input")
    if not isinstance(text, str):
        raise bad_request(f"`{where}.input` must be a string.", f"{where}.input")
    call = _function_call({**item, "arguments": ""}, where)
    return ToolCall(call.id, call.name, orjson.dumps({CUSTOM_INPUT: text}).decode())


def _additional_tools(item: dict[str, Any], where: str) -> list[Any]:
    """The tools of an `additional_tools` item (a developer's, as OpenAI's API has it)."""
    if item.get("role", "developer") != "developer":
        raise bad_request(f'`{where}.role` must be "developer".', f"{where}.role")
    tools = item.get("tools")
    if not isinstance(tools, list):
        raise bad_request(f"`{where}.tools` must be an array of tools.", f"{where}.tools")
    return tools


def _tool_lists(tools: object, raw_input: object) -> Iterator[tuple[str, object]]:
    """Each list of tools the request offers, with where it is: `tools`, then those of
    the `additional_tools` items of `input`, in order."""
    yield "tools", tools
    for index, item in enumerate(raw_input if isinstance(raw_input, list) else []):
        if isinstance(item, dict) and item.get("type") == "additional_tools":
            where = f"input[{index}]"
            yield f"{where}.tools", _additional_tools(item, where)


def _function_output(item: dict[str, Any], where: str) -> ChatMessage:
    call_id, output = item.get("call_id"), item.get("output")
    if not isinstance(call_id, str) or not call_id:
        raise bad_request(f"`{where}.call_id` must be a non-empty string.", f"{where}.call_id")
    if isinstance(output, list):
        texts = [part.get("text", "") for part in output if isinstance(part, dict)]
        if not all(isinstance(text, str) for text in texts):  # `5`, `null`, a list: no text
            raise bad_request(
                f"`{where}.output` parts must hold their `text` as a string.", f"{where}.output"
            )
        output = "".join(texts)
    if not isinstance(output, str):
        raise bad_request(f"`{where}.output` must be a string.", f"{where}.output")
    return ChatMessage("tool", output, tool_call_id=call_id)


def _lists_key(lists: list[tuple[str, object]]) -> bytes | None:
    """The key of a request's tool lists: the JSON of `tools` alone, the usual case, or
    each list's with where it is."""
    if len(lists) == 1:
        return key_of(lists[0][1])
    parts = []
    for place, raw in lists:
        key = key_of(raw)
        if key is None:
            return None
        parts.append(place.encode() + b"=" + key)
    return b"\n".join(parts)


def _offer_tools(lists: list[tuple[str, object]]) -> tuple[_OfferedTools, tuple[Tool, ...]]:
    """The request's tool lists ((where, list) pairs) as the model is offered them."""
    offered = _offered_tools(lists)
    try:
        return offered, parse_tools(offered.functions)
    except APIError as exc:  # the chat parser names chat's field: name the request's
        raise _renamed_tool_error(exc, offered.places) from None


@dataclass(slots=True)
class _OfferedTools:
    """`tools` as the model is offered them: chat's function tools (for the shared
    checks), where each came from in `tools`, the namespaced ones' names, and the types
    of the tools left out (each once, in order)."""

    functions: list[dict[str, Any]] = field(default_factory=list)
    places: list[str] = field(default_factory=list)
    namespaced: dict[str, tuple[str, str]] = field(default_factory=dict)
    custom: set[str] = field(default_factory=set)
    omitted: tuple[str, ...] = ()
    # `tools` as the answer echoes them: each tool's known fields, bounded (`hosted_tools`).
    echo: orjson.Fragment = field(default_factory=lambda: orjson.Fragment(b"[]"))


def _offered_tools(lists: Iterable[tuple[str, object]]) -> _OfferedTools:
    offered = _OfferedTools()
    omitted: dict[str, None] = {}  # an ordered set
    echo: list[dict[str, Any]] = []
    entries = 0
    for place, raw in lists:
        raw = tools_value(raw)
        if raw is None:
            continue
        if not isinstance(raw, list):
            raise bad_request(f"`{place}` must be an array.", place)
        entries += len(raw)
        if entries > MAX_TOOL_ENTRIES:
            raise _too_many_entries()
        for index, tool in enumerate(raw):
            where = f"{place}[{index}]"
            kind = _tool_type(tool, where)
            if kind in _OFFERED:
                _offer(offered, tool, where, kind)
            elif kind == "namespace":
                namespace, inner = _namespace(tool, where)
                entries += len(inner)
                if entries > MAX_TOOL_ENTRIES:
                    raise _too_many_entries()
                for number, member in enumerate(inner):
                    at = f"{where}.tools[{number}]"
                    member_kind = _tool_type(member, at)
                    if member_kind not in _OFFERED:  # as OpenAI's: functions and custom only
                        raise bad_request(
                            f"`{at}.type` {member_kind!r} is not allowed in a namespace: only "
                            '"function" and "custom" are.',
                            f"{at}.type",
                        )
                    _offer(offered, member, at, member_kind, namespace)
            else:
                omitted[kind] = None
            if place == "tools":  # the top-level list alone is echoed
                echo.append(echoed_tool(tool, kind, where))
    if len(offered.functions) > MAX_TOOLS:
        raise bad_request(
            f"`tools` may hold at most {MAX_TOOLS} function tools, counting those of namespaces.",
            "tools",
        )
    offered.omitted = tuple(omitted)
    offered.echo = orjson.Fragment(orjson.dumps(echo))
    return offered


# Kept by the lists' JSON: an agent sends the same tools every turn (`tool_lists`).
_TOOLS = ToolListCache(_offer_tools)


def _too_many_entries() -> APIError:
    return bad_request(
        f"`tools` may hold at most {MAX_TOOL_ENTRIES} tools, counting those of namespaces.",
        "tools",
    )


def _tool_type(tool: object, where: str) -> str:
    """A tool's `type`, which the gateway may repeat (in a header, a log line)."""
    if not isinstance(tool, dict):
        raise bad_request(f"`{where}` must be an object.", where)
    kind = tool.get("type")
    if not isinstance(kind, str) or not _TOOL_TYPE.fullmatch(kind):
        raise bad_request(
            f"`{where}.type` must be a tool type: 1 to 64 letters, digits, `_`, `.` or `-`.",
            f"{where}.type",
        )
    return kind


def _namespace(tool: dict[str, Any], where: str) -> tuple[str, list[Any]]:
    name, inner = tool.get("name"), tool.get("tools")
    if not isinstance(name, str) or not _NAMESPACE.fullmatch(name):
        raise bad_request(
            f"`{where}.name` must be 1 to 64 letters, digits, `_` or `-`.", f"{where}.name"
        )
    if not isinstance(inner, list) or not inner:
        raise bad_request(f"`{where}.tools` must be a non-empty array of tools.", f"{where}.tools")
    description = tool.get("description")
    if description is not None and not isinstance(description, str):
        raise bad_request(f"`{where}.description` must be a string.", f"{where}.description")
    return name, inner


_OFFERED = ("function", "custom")


def _offer(
    offered: _OfferedTools,
    tool: dict[str, Any],
    where: str,
    kind: str,
    namespace: str | None = None,
) -> None:
    """A function tool (flat in Responses) or a custom tool as chat's function tool,
    named as the model will know it."""
    if kind == "custom":
        function = _custom_as_function(tool, where)
    else:
        keys = ("name", "description", "parameters", "strict")
        function = {k: tool[k] for k in keys if k in tool}
    name = tool.get("name")
    if namespace is not None and isinstance(name, str):
        if not name:  # `ns__` would pass the name rule, and answer a call named ""
            raise bad_request(f"`{where}.name` must not be empty.", f"{where}.name")
        flat = f"{namespace}{NAMESPACE_SEPARATOR}{name}"
        if len(flat) > 64 and len(name) <= 64:
            raise bad_request(
                f"`{where}.name`: with its namespace, `{flat}` is longer than the 64 "
                "characters a tool name may have.",
                f"{where}.name",
            )
        function["name"] = flat
        offered.namespaced[flat] = (namespace, name)
    if kind == "custom":
        offered.custom.add(str(function.get("name")))
    offered.functions.append({"type": "function", "function": function})
    offered.places.append(where)


def _custom_as_function(tool: dict[str, Any], where: str) -> dict[str, Any]:
    """A custom tool as a function of one string argument, `input`, whose description
    tells the model the text's format: free text, or a grammar it should follow (the
    gateway does not constrain the text to it; the client checks what it runs)."""
    text_format = tool.get("format", {"type": "text"})
    kind = text_format.get("type") if isinstance(text_format, dict) else None
    if kind == "text":
        told = "Free-form text: the whole input of the tool, not JSON."
    elif kind == "grammar":
        syntax, definition = text_format.get("syntax"), text_format.get("definition")
        if syntax not in ("lark", "regex") or not isinstance(definition, str):
            raise bad_request(
                f'`{where}.format` must have a `syntax` of "lark" or "regex" and a '
                "`definition` string.",
                f"{where}.format",
            )
        if len(definition) > MAX_GRAMMAR_CHARS:
            raise bad_request(
                f"`{where}.format.definition` may be at most {MAX_GRAMMAR_CHARS} characters.",
                f"{where}.format.definition",
            )
        told = f"The whole input of the tool, as text matching this {syntax} grammar:\n{definition}"
    else:
        raise bad_request(
            f'`{where}.format.type` must be "text" or "grammar".', f"{where}.format.type"
        )
    function: dict[str, Any] = {k: tool[k] for k in ("name", "description") if k in tool}
    function["parameters"] = {
        "type": "object",
        "properties": {CUSTOM_INPUT: {"type": "string", "description": told}},
        "required": [CUSTOM_INPUT],
        "additionalProperties": False,
    }
    return function


def _renamed_tool_error(error: APIError, places: list[str]) -> APIError:
    """A 400 of the chat parser, which names `tools[k].function.x` of the flat list,
    naming the field where the request has it (`tools[i].x`, `tools[i].tools[j].x`)."""
    param = error.param or "tools"
    found = re.match(r"tools\[(\d+)\]\.function", param)
    if found is None:
        return renamed(error, "tools")
    return renamed(error, "tools", (found.group(0), places[int(found.group(1))]))


def _tool_choice(
    raw: object, names: set[str], custom: set[str], omitted: tuple[str, ...]
) -> tuple[str | None, str | None]:
    if raw is None or raw in ("none", "auto"):
        return (None if raw is None else str(raw)), None
    kind = raw.get("type") if isinstance(raw, dict) else None
    if isinstance(kind, str) and kind not in ("function", "custom", "allowed_tools"):
        # A hosted, MCP, shell or custom tool: all left out of the request.
        shown = kind if _TOOL_TYPE.fullmatch(kind) else "this type"
        raise bad_request(_forced_hosted(shown), "tool_choice")
    if not names:
        left_out = f" (left out: {', '.join(omitted)})" if omitted else ""
        raise bad_request(
            f"`tool_choice` asks for a tool call, but `tools` has no function tool{left_out}.",
            "tool_choice",
        )
    if raw == "required":
        return "required", None
    name = raw.get("name") if isinstance(raw, dict) and kind in ("function", "custom") else None
    if not isinstance(raw, dict) or not isinstance(name, str):
        raise bad_request(
            '`tool_choice` must be "none", "auto", "required" or {"type": "function" or '
            '"custom", "name": ...}.',
            "tool_choice",
        )
    namespace = raw.get("namespace")
    if isinstance(namespace, str) and namespace:
        name = f"{namespace}{NAMESPACE_SEPARATOR}{name}"
    if name not in names or (name in custom) != (kind == "custom"):
        if name in omitted:  # a hosted tool asked for by its type as a function's name
            raise bad_request(_forced_hosted(name), "tool_choice")
        raise bad_request(
            f"`tool_choice.name`: {name!r} is not one of `tools`' {kind} tools.",
            "tool_choice.name",
        )
    return "required", name


def _echoed_choice(raw: object) -> Any:
    """`tool_choice` (accepted by `_tool_choice`) as the answer echoes it: its own fields
    only."""
    if not isinstance(raw, dict):
        return raw or "auto"
    return {k: raw[k] for k in ("type", "name", "namespace") if isinstance(raw.get(k), str)}


_FORMAT_FIELDS = ("type", "name", "schema", "strict", "description")


def _echoed_format(raw: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """`text.format` (accepted by `_response_format`) as the answer echoes it: its own
    fields only."""
    if not raw:
        return {"type": "text"}
    echoed = {k: raw[k] for k in _FORMAT_FIELDS if k in raw}
    if not isinstance(echoed.get("description", ""), str):
        del echoed["description"]  # not read: not echoed
    return echoed


def _forced_hosted(kind: str) -> str:
    return (
        f"`tool_choice` forces {kind!r}, a tool the gateway leaves out of requests: "
        "its models cannot run it."
    )


def _response_format(raw: object) -> ResponseFormat | None:
    """`text.format` as chat's `response_format` (flat in Responses, nested in chat)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise bad_request("`text.format` must be an object.", "text.format")
    chat = raw
    if raw.get("type") == "json_schema":
        spec = {k: raw[k] for k in ("name", "schema", "strict", "description") if k in raw}
        chat = {"type": "json_schema", "json_schema": spec}
    try:
        return parse_response_format(chat)
    except APIError as exc:  # the chat parser names chat's field: name the Responses one
        raise renamed(
            exc,
            "response_format",
            ("response_format.json_schema", "text.format"),
            ("response_format", "text.format"),
        ) from None


def _metadata(raw: object) -> dict[str, str]:
    """`metadata` as OpenAI bounds it: at most 16 string values, keys of at most 64
    characters, values of at most 512."""
    if raw is None:
        return {}
    if (
        not isinstance(raw, dict)
        or len(raw) > MAX_METADATA
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items())
    ):
        raise bad_request(
            f"`metadata` must be an object of at most {MAX_METADATA} string values.", "metadata"
        )
    for key, value in raw.items():
        if len(key) > MAX_METADATA_KEY:
            raise bad_request(
                f"`metadata` keys are at most {MAX_METADATA_KEY} characters; one has {len(key)}.",
                "metadata",
            )
        if len(value) > MAX_METADATA_VALUE:
            raise bad_request(
                f"`metadata` values are at most {MAX_METADATA_VALUE} characters; the value "
                f"of `{key}` has {len(value)}.",
                "metadata",
            )
    return dict(raw)
