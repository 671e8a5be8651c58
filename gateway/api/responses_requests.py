"""Parse OpenAI Responses API bodies (`POST /v1/responses`) into `InferenceRequest`.

`input` (a text, or items: messages with text parts, `function_call` and
`function_call_output` items) becomes chat messages after the stored conversation of
`previous_response_id`, with `instructions` as the system message (not carried over
from the previous response, as OpenAI does). Function tools, `tool_choice` and
`text.format` map onto the chat options. What the answer must echo (metadata, store,
the tools as sent) rides along as the request's `wire_state`. `reasoning` is accepted
and ignored: the models served here do not reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.api.errors import APIError, bad_request, renamed
from gateway.api.requests import (
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
    try:
        tools = parse_tools(_as_functions(raw_tools))
    except APIError as exc:  # the chat parser names chat's nested field: name the flat one
        raise renamed(exc, "tools", (".function.", ".")) from None
    choice, forced = _tool_choice(data.get("tool_choice"), {tool.name for tool in tools})
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
    return ToolCall(str(call_id), str(name), arguments)


def _function_output(item: dict[str, Any], where: str) -> ChatMessage:
    call_id, output = item.get("call_id"), item.get("output")
    if not isinstance(call_id, str) or not call_id:
        raise bad_request(f"`{where}.call_id` must be a non-empty string.", f"{where}.call_id")
    if isinstance(output, list):
        output = "".join(part.get("text", "") for part in output if isinstance(part, dict))
    if not isinstance(output, str):
        raise bad_request(f"`{where}.output` must be a string.", f"{where}.output")
    return ChatMessage("tool", output, tool_call_id=call_id)


def _as_functions(raw: object) -> object:
    """Responses function tools (flat) as chat's, for the shared checks."""
    if not isinstance(raw, list):
        return raw
    tools = []
    for index, tool in enumerate(raw):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise bad_request(
                f"`tools[{index}].type` {kind!r} is not supported: only function tools are.",
                f"tools[{index}].type",
            )
        function = {
            k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool
        }
        tools.append({"type": "function", "function": function})
    return tools


def _tool_choice(raw: object, names: set[str]) -> tuple[str | None, str | None]:
    if raw is None or raw in ("none", "auto"):
        return (None if raw is None else str(raw)), None
    if not names:
        raise bad_request(
            "`tool_choice` asks for a tool call, but `tools` is empty.", "tool_choice"
        )
    if raw == "required":
        return "required", None
    name = raw.get("name") if isinstance(raw, dict) and raw.get("type") == "function" else None
    if not isinstance(name, str):
        raise bad_request(
            '`tool_choice` must be "none", "auto", "required" or {"type": "function", "name": '
            "...}.",
            "tool_choice",
        )
    if name not in names:
        raise bad_request(
            f"`tool_choice.name`: {name!r} is not one of `tools`.", "tool_choice.name"
        )
    return "required", name


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
