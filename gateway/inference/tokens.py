"""Token counts when the upstream does not report them."""

from __future__ import annotations

from collections.abc import Iterable

import orjson

from gateway.inference.types import ChatMessage, InferenceRequest, RequestKind, Tool

# About four characters per token for English text with BPE tokenizers; used only to
# estimate before the upstream reports exact counts.
CHARS_PER_TOKEN = 4


def estimate_tokens(text: str) -> int:
    """A rough token count of `text` (at least 1 for non-empty text)."""
    return -(-len(text) // CHARS_PER_TOKEN)


# What a chat format adds around the messages, in tokens: about 4 per message (role and
# delimiters) and 3 to prime the reply (OpenAI's published count for its chat models).
TOKENS_PER_MESSAGE = 4
TOKENS_PER_REPLY = 3


def estimate_chat_tokens(messages: Iterable[ChatMessage], tools: Iterable[Tool] = ()) -> int:
    """A rough token count of chat messages (with their tool calls) and tool definitions
    as a server's own template renders them."""
    total = TOKENS_PER_REPLY
    for message in messages:
        total += TOKENS_PER_MESSAGE + estimate_tokens(message.content)
        for call in message.tool_calls:
            total += estimate_tokens(call.name) + estimate_tokens(call.arguments)
    for tool in tools:
        total += estimate_tokens(orjson.dumps(_tool_json(tool)).decode())
    return total


def _tool_json(tool: Tool) -> dict[str, object]:
    return {"name": tool.name, "description": tool.description, "parameters": tool.parameters}


def estimate_request_tokens(request: InferenceRequest) -> int:
    """A rough prompt token count of `request` before any template renders it."""
    if request.kind is RequestKind.CHAT:
        return estimate_chat_tokens(request.messages, request.options.tools)
    if request.kind is RequestKind.EMBEDDING:
        return sum(estimate_tokens(text) for text in request.inputs)
    return estimate_tokens(request.prompt)
