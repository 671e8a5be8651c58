"""Parse OpenAI Responses API bodies (`POST /v1/responses`) into `InferenceRequest`.

`input` (a text, or items: messages with text parts, `function_call` and
`function_call_output` items) becomes chat messages after the stored conversation of
`previous_response_id`, with `instructions` as the system message (not carried over
from the previous response, as OpenAI does). Function tools, `tool_choice` and
`text.format` map onto the chat options. What the answer must echo (metadata, store,
the tools as sent) rides along as the request's `wire_state`. `reasoning` is accepted
and ignored: the models served here do not reason.

Tools: function tools are offered to the model as they are; the function tools of a
`namespace` tool too, each under the name `<namespace>__<name>` (`__`: the internal name
rule has no `.`), so that two namespaces' same names cannot collide; a call of one is
answered as OpenAI does, with `name` and `namespace` apart. Every other tool type (the
hosted tools: web search, file search, MCP, shells, ...; `custom` free-form tools;
types the gateway does not know) is left out: no model here can run it. The request
names what it left out (`InferenceRequest.omitted_tools`), which the answer's
`x-gateway-omitted-tools` header says; a `tool_choice` that forces one is a 400.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.api.errors import APIError, bad_request, renamed
from gateway.api.requests import (
    MAX_TOOLS,
    check_tool_results,
    optional_bool,
    optional_float,
    optional_int,
    parse_response_format,
    parse_tools,
    requested_model,
)
from gateway.inference.types import (
    ChatMessage,
    ChatOptions,
    InferenceRequest,
    RequestKind,
    ResponseFormat,
    SamplingParams,
    ToolCall,
)

MAX_METADATA = 16
# Entries of `tools`, namespaces' included, walked at most: the function tools among them
# are capped by `MAX_TOOLS` as chat's are; this bounds the hosted ones left out.
MAX_TOOL_ENTRIES = 4 * MAX_TOOLS
# How a namespace's function is named to the model: `<namespace>__<name>`.
NAMESPACE_SEPARATOR = "__"
# A tool type or namespace name as the gateway repeats it (in a header, a log line):
# nothing a header could not carry.
_TOOL_TYPE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_NAMESPACE = re.compile(r"[A-Za-z0-9_-]{1,64}")

log = logging.getLogger("gateway")


@dataclass(frozen=True, slots=True)
class ResponsesState:
    """What a Responses answer echoes of its request, and what storing it needs."""

    instructions: str | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    store: bool = True
    previous_response_id: str | None = None
    # The request's tools, tool_choice and text format as the answer shows them.
    tools: Sequence[Mapping[str, Any]] = ()
    tool_choice: Any = "auto"
    # A namespace's functions, by the name the model knows them by: (namespace, name).
    namespaced: Mapping[str, tuple[str, str]] = field(default_factory=dict)
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
    conversation = (*history, *_input(data.get("input")))
    check_tool_results(conversation, _output_places(data.get("input")))
    instructions = data.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad_request("`instructions` must be a string.", "instructions")
    messages = conversation
    if instructions:
        messages = (ChatMessage("system", instructions), *conversation)
    raw_tools = data.get("tools")
    offered = _offered_tools(raw_tools)
    try:
        tools = parse_tools(offered.functions)
    except APIError as exc:  # the chat parser names chat's field: name the request's
        raise _renamed_tool_error(exc, offered.places) from None
    if offered.omitted:
        # Never silently: the answer's header says it too.
        # The model as sent, cut short: a client chooses its length (1 MB made 1 MB lines).
        log.info(
            "responses: tools left out for model %r (no model here runs them): %s",
            requested_model(data)[:100],
            ", ".join(offered.omitted[:20]) + (" ..." if len(offered.omitted) > 20 else ""),
        )
    choice, forced = _tool_choice(
        data.get("tool_choice"), {tool.name for tool in tools}, offered.omitted
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
        tools=raw_tools if isinstance(raw_tools, list) else (),
        tool_choice=data.get("tool_choice") or "auto",
        namespaced=offered.namespaced,
        text_format=text_format or {"type": "text"},
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
        if isinstance(item, dict) and item.get("type") == "function_call_output":
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
        elif kind == "function_call":
            call = _function_call(item, where)
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant" and not last.content:
                # Calls made together come as consecutive items: one assistant turn.
                messages[-1] = ChatMessage("assistant", "", (*last.tool_calls, call))
            else:
                messages.append(ChatMessage("assistant", "", (call,)))
        elif kind == "function_call_output":
            messages.append(_function_output(item, where))
        elif kind == "reasoning":
            continue  # a reasoning model's earlier thoughts: not for these models
        else:
            raise bad_request(
                f"`{where}.type` {kind!r} is not supported (message, function_call, "
                "function_call_output).",
                f"{where}.type",
            )
    return messages


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


@dataclass(slots=True)
class _OfferedTools:
    """`tools` as the model is offered them: chat's function tools (for the shared
    checks), where each came from in `tools`, the namespaced ones' names, and the types
    of the tools left out (each once, in order)."""

    functions: list[dict[str, Any]] = field(default_factory=list)
    places: list[str] = field(default_factory=list)
    namespaced: dict[str, tuple[str, str]] = field(default_factory=dict)
    omitted: tuple[str, ...] = ()


def _offered_tools(raw: object) -> _OfferedTools:
    offered = _OfferedTools()
    if raw is None:
        return offered
    if not isinstance(raw, list):
        raise bad_request("`tools` must be an array.", "tools")
    entries = len(raw)
    if entries > MAX_TOOL_ENTRIES:
        raise _too_many_entries()
    omitted: dict[str, None] = {}  # an ordered set
    for index, tool in enumerate(raw):
        where = f"tools[{index}]"
        kind = _tool_type(tool, where)
        if kind == "function":
            _offer(offered, tool, where)
        elif kind == "namespace":
            namespace, inner = _namespace(tool, where)
            entries += len(inner)
            if entries > MAX_TOOL_ENTRIES:
                raise _too_many_entries()
            for number, member in enumerate(inner):
                at = f"{where}.tools[{number}]"
                member_kind = _tool_type(member, at)
                if member_kind == "function":
                    _offer(offered, member, at, namespace)
                elif member_kind == "custom":
                    omitted["custom"] = None
                else:  # as OpenAI's: a namespace holds function and custom tools only
                    raise bad_request(
                        f"`{at}.type` {member_kind!r} is not allowed in a namespace: only "
                        '"function" and "custom" are.',
                        f"{at}.type",
                    )
        else:
            omitted[kind] = None
    if len(offered.functions) > MAX_TOOLS:
        raise bad_request(
            f"`tools` may hold at most {MAX_TOOLS} function tools, counting those of namespaces.",
            "tools",
        )
    offered.omitted = tuple(omitted)
    return offered


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


def _offer(
    offered: _OfferedTools, tool: dict[str, Any], where: str, namespace: str | None = None
) -> None:
    """A function tool (flat in Responses) as chat's, named as the model will know it."""
    function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
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
    offered.functions.append({"type": "function", "function": function})
    offered.places.append(where)


def _renamed_tool_error(error: APIError, places: list[str]) -> APIError:
    """A 400 of the chat parser, which names `tools[k].function.x` of the flat list,
    naming the field where the request has it (`tools[i].x`, `tools[i].tools[j].x`)."""
    param = error.param or "tools"
    found = re.match(r"tools\[(\d+)\]\.function", param)
    if found is None:
        return renamed(error, "tools")
    return renamed(error, "tools", (found.group(0), places[int(found.group(1))]))


def _tool_choice(
    raw: object, names: set[str], omitted: tuple[str, ...]
) -> tuple[str | None, str | None]:
    if raw is None or raw in ("none", "auto"):
        return (None if raw is None else str(raw)), None
    kind = raw.get("type") if isinstance(raw, dict) else None
    if isinstance(kind, str) and kind not in ("function", "allowed_tools"):
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
    name = raw.get("name") if isinstance(raw, dict) and kind == "function" else None
    if not isinstance(raw, dict) or not isinstance(name, str):
        raise bad_request(
            '`tool_choice` must be "none", "auto", "required" or {"type": "function", "name": '
            "...}.",
            "tool_choice",
        )
    namespace = raw.get("namespace")
    if isinstance(namespace, str) and namespace:
        name = f"{namespace}{NAMESPACE_SEPARATOR}{name}"
    if name not in names:
        if name in omitted:  # a hosted tool asked for by its type as a function's name
            raise bad_request(_forced_hosted(name), "tool_choice")
        raise bad_request(
            f"`tool_choice.name`: {name!r} is not one of `tools`.", "tool_choice.name"
        )
    return "required", name


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
    return dict(raw)
