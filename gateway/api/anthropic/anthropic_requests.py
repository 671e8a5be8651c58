"""Parse Anthropic Messages bodies (`POST /v1/messages`) into `InferenceRequest`.

Anthropic's content blocks map onto the chat request the rest of the gateway serves:
`system` becomes a system message, an assistant's `tool_use` blocks its tool calls, a
user's `tool_result` blocks `tool` messages (before the rest of its text). A `system`
message inside `messages` (Claude Code's `mid-conversation-system` beta) stays where it
stands, as chat's do.

One rule for what the gateway does not use (docs/coding-tools.md):
- top-level fields it does not know (`thinking`, `context_management`, `output_config`,
  ...) and fields of a block it does not read (`cache_control`, `citations`) are ignored;
- a block of an earlier answer (an assistant message) other than `text` and `tool_use`
  is dropped and named in the log: it records what a model or a server tool did
  (`thinking`, `server_tool_use`, `web_search_tool_result`, ...), which the models
  served here cannot read, and the conversation goes on without it;
- any other block of a user or system message (`image`, `document`, `search_result`,
  ...) is a 400 naming it: it is what the model was given to answer from, and an answer
  without it would answer another question.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

import orjson

from gateway.api.body import (
    MAX_STOP,
    check_tool_results,
    optional_bool,
    optional_float,
    optional_int,
    parse_tools,
    requested_model,
    tools_value,
)
from gateway.api.errors import APIError, bad_request, renamed
from gateway.api.tool_lists import ToolListCache
from gateway.inference.types import (
    ChatMessage,
    ChatOptions,
    InferenceRequest,
    RequestKind,
    SamplingParams,
    Tool,
    ToolCall,
)

ROLES = ("user", "assistant", "system")

# A block type the gateway may name in its log and errors: Anthropic's are short
# snake_case words; anything else is a malformed block, not a new kind of one.
_BLOCK_TYPE = re.compile(r"[a-z][a-z0-9_]{0,63}")

log = logging.getLogger("gateway")


def parse_messages(data: Mapping[str, Any], default_max_tokens: int) -> InferenceRequest:
    """A `/v1/messages` body; `max_tokens` is required."""
    max_tokens = optional_int(data, "max_tokens", minimum=1)
    if max_tokens is None:
        raise bad_request("`max_tokens` is required.", "max_tokens")
    return _request(data, max_tokens, max_tokens)


def parse_count_tokens(data: Mapping[str, Any], default_max_tokens: int) -> InferenceRequest:
    """A `/v1/messages/count_tokens` body: a message request without `max_tokens`."""
    return _request(data, default_max_tokens, None)


def _request(data: Mapping[str, Any], max_tokens: int, requested: int | None) -> InferenceRequest:
    raw = data.get("messages")
    if not isinstance(raw, list) or not raw:
        raise bad_request("`messages` must be a non-empty array.", "messages")
    messages = [*_system(data.get("system"))]
    dropped: set[str] = set()
    for index, message in enumerate(raw):
        messages += _message(message, index, dropped)
    if dropped:
        # Once a request, the distinct types: a long conversation's thinking blocks
        # make one line, not one each.
        # At most 20 names: a client chooses how many distinct types it sends.
        names = sorted(dropped)
        more = " ..." if len(names) > 20 else ""
        log.info("messages: blocks dropped from the prompt: %s", ", ".join(names[:20]) + more)
    check_tool_results(tuple(messages), _where_result(raw))
    stop = data.get("stop_sequences")
    if stop is not None and (
        not isinstance(stop, list)
        or len(stop) > MAX_STOP
        or not all(isinstance(s, str) and s for s in stop)
    ):
        raise bad_request(
            f"`stop_sequences` must be up to {MAX_STOP} non-empty strings.", "stop_sequences"
        )
    if data.get("top_k") is not None:
        raise bad_request("`top_k` is not supported by the models of this gateway.", "top_k")
    tools = _TOOLS.parse(data.get("tools"))
    choice, forced, parallel = _tool_choice(data.get("tool_choice"), {t.name for t in tools})
    metadata = data.get("metadata")
    user = metadata.get("user_id") if isinstance(metadata, dict) else None
    if metadata is not None and (
        not isinstance(metadata, dict) or not isinstance(user, str | None)
    ):
        raise bad_request("`metadata.user_id` must be a string.", "metadata.user_id")
    return InferenceRequest(
        kind=RequestKind.CHAT,
        model=requested_model(data),
        params=SamplingParams(
            max_tokens=max_tokens,
            temperature=optional_float(data, "temperature", 0.0, 1.0),
            top_p=optional_float(data, "top_p", 0.0, 1.0),
            stop=tuple(stop or ()),
        ),
        stream=optional_bool(data, "stream") or False,
        messages=tuple(messages),
        requested_max_tokens=requested,
        user=user,
        options=ChatOptions(
            tools=tools,
            tool_choice=choice,
            forced_tool=forced,
            parallel_tool_calls=parallel if tools else None,
        ),
    )


def _system(raw: object) -> list[ChatMessage]:
    if raw is None or raw == "":
        return []
    if isinstance(raw, str):
        return [ChatMessage("system", raw)]
    if isinstance(raw, list):
        return [ChatMessage("system", "".join(_texts(raw, "system")))]
    raise bad_request("`system` must be a string or an array of text blocks.", "system")


def _texts(blocks: list[Any], where: str) -> list[str]:
    texts = []
    for index, block in enumerate(blocks):
        at = f"{where}[{index}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind != "text":
            raise bad_request(f'`{at}.type` must be "text".', f"{at}.type")
        text = block.get("text")
        if not isinstance(text, str):
            raise bad_request(f"`{at}.text` must be a string.", f"{at}.text")
        texts.append(text)
    return texts


def _message(raw: object, index: int, dropped: set[str]) -> list[ChatMessage]:
    """One Anthropic message as chat messages: several when it holds tool results. The
    types of the blocks it drops go into `dropped`."""
    where = f"messages[{index}]"
    if not isinstance(raw, dict):
        raise bad_request(f"`{where}` must be an object.", where)
    role = raw.get("role")
    if role not in ROLES:
        raise bad_request(
            f'`{where}.role` must be "user", "assistant" or "system".', f"{where}.role"
        )
    content = raw.get("content")
    if isinstance(content, str):
        return [ChatMessage(role, content)]
    if not isinstance(content, list):
        raise bad_request(
            f"`{where}.content` must be a string or an array of blocks.", f"{where}.content"
        )
    if role == "system":
        return [ChatMessage("system", "".join(_texts(content, f"{where}.content")))]
    texts: list[str] = []
    calls: list[ToolCall] = []
    results: list[ChatMessage] = []
    for number, block in enumerate(content):
        at = f"{where}.content[{number}]"
        if not isinstance(block, dict):
            raise bad_request(f"`{at}` must be an object.", at)
        kind = block.get("type")
        if kind == "text":
            text = block.get("text")
            if not isinstance(text, str):
                raise bad_request(f"`{at}.text` must be a string.", f"{at}.text")
            texts.append(text)
        elif kind == "tool_use" and role == "assistant":
            calls.append(_tool_use(block, at))
        elif kind == "tool_result" and role == "user":
            results.append(_tool_result(block, at))
        elif not isinstance(kind, str) or not _BLOCK_TYPE.fullmatch(kind):
            raise bad_request(f"`{at}.type` must be a block type.", f"{at}.type")
        elif role == "assistant" and kind != "tool_result":
            dropped.add(kind)  # an earlier answer's record the model cannot read
        else:
            allowed = "text, tool_use" if role == "assistant" else "text, tool_result"
            raise bad_request(
                f"`{at}.type` {kind!r} is not supported in a {role} message (only {allowed}).",
                f"{at}.type",
            )
    text = "".join(texts)
    if role == "assistant":
        return [ChatMessage("assistant", text, tool_calls=tuple(calls))]
    return results + ([ChatMessage("user", text)] if texts or not results else [])


def _tool_use(block: dict[str, Any], at: str) -> ToolCall:
    call_id, name, arguments = block.get("id"), block.get("name"), block.get("input")
    if not isinstance(call_id, str) or not call_id:
        raise bad_request(f"`{at}.id` must be a non-empty string.", f"{at}.id")
    if not isinstance(name, str) or not name:
        raise bad_request(f"`{at}.name` must be a non-empty string.", f"{at}.name")
    if not isinstance(arguments, dict):
        raise bad_request(f"`{at}.input` must be an object.", f"{at}.input")
    return ToolCall(call_id, name, orjson.dumps(arguments).decode())


def _tool_result(block: dict[str, Any], at: str) -> ChatMessage:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise bad_request(f"`{at}.tool_use_id` must be a non-empty string.", f"{at}.tool_use_id")
    content = block.get("content", "")
    if isinstance(content, list):
        content = "".join(_texts(content, f"{at}.content"))
    if not isinstance(content, str):
        raise bad_request(
            f"`{at}.content` must be a string or an array of text blocks.", f"{at}.content"
        )
    if block.get("is_error") is True:
        content = f"Error: {content}"
    return ChatMessage("tool", content, tool_call_id=call_id)


def _where_result(raw: list[Any]) -> dict[str, str]:
    """Where each tool result sits in the Anthropic body, by the call id it answers."""
    places = {}
    for index, message in enumerate(raw):
        content = message.get("content") if isinstance(message, dict) else None
        for number, block in enumerate(content if isinstance(content, list) else []):
            if isinstance(block, dict) and block.get("type") == "tool_result":
                call_id = block.get("tool_use_id")
                if isinstance(call_id, str):
                    places[call_id] = f"messages[{index}].content[{number}].tool_use_id"
    return places


def _parse_tools(raw: object) -> tuple[Tool, ...]:
    """`tools`, checked as OpenAI's are; a refusal names Anthropic's field."""
    try:
        return parse_tools(_as_functions(raw))
    except APIError as exc:
        raise renamed(exc, "tools", (".function.", "."), (".parameters", ".input_schema")) from None


# Kept by the list's JSON: an agent sends the same tools every turn (`tool_lists`).
_TOOLS = ToolListCache(lambda raw: _parse_tools(tools_value(raw)))


def _as_functions(raw: object) -> object:
    """Anthropic's tools as OpenAI's function tools, for the shared checks."""
    if not isinstance(raw, list):
        return raw
    tools = []
    for index, tool in enumerate(raw):
        if not isinstance(tool, dict):
            raise bad_request(f"`tools[{index}]` must be an object.", f"tools[{index}]")
        kind = tool.get("type", "custom")
        if kind != "custom":
            raise bad_request(
                f"`tools[{index}].type` {kind!r} is not supported: only custom tools (with "
                "`input_schema`) are.",
                f"tools[{index}].type",
            )
        function = {
            "name": tool.get("name"),
            "parameters": tool.get("input_schema"),
            **({"description": tool["description"]} if "description" in tool else {}),
        }
        if function["parameters"] is None:
            raise bad_request(
                f"`tools[{index}].input_schema` is required.", f"tools[{index}].input_schema"
            )
        tools.append({"type": "function", "function": function})
    return tools


def _tool_choice(raw: object, names: set[str]) -> tuple[str | None, str | None, bool | None]:
    """(mode, forced function, parallel calls) of `tool_choice`."""
    if raw is None:
        return None, None, None
    kind = raw.get("type") if isinstance(raw, dict) else None
    if not isinstance(raw, dict) or kind not in ("auto", "any", "tool", "none"):
        raise bad_request(
            '`tool_choice.type` must be "auto", "any", "tool" or "none".', "tool_choice.type"
        )
    disable = raw.get("disable_parallel_tool_use")
    if disable is not None and not isinstance(disable, bool):
        raise bad_request(
            "`tool_choice.disable_parallel_tool_use` must be a boolean.",
            "tool_choice.disable_parallel_tool_use",
        )
    parallel = None if disable is None else not disable
    if kind == "none":
        return "none", None, parallel
    if kind in ("any", "tool") and not names:
        raise bad_request(
            "`tool_choice` asks for a tool call, but `tools` is empty.", "tool_choice"
        )
    if kind == "auto":
        return "auto", None, parallel
    if kind == "any":
        return "required", None, parallel
    name = raw.get("name")
    if not isinstance(name, str):  # a list or an object is no name (nor hashable)
        raise bad_request("`tool_choice.name` must be a string.", "tool_choice.name")
    if name not in names:
        raise bad_request(
            f"`tool_choice.name`: {name[:64]!r} is not one of `tools`.", "tool_choice.name"
        )
    return "required", name, parallel
