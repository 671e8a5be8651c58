"""Token counts when the upstream does not report them."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import orjson

from gateway.inference.memo import ObjectMemo
from gateway.inference.types import ChatMessage, InferenceRequest, RequestKind, Tool

# About four characters per token for English text (and code) with BPE tokenizers; used
# only to estimate before the upstream reports exact counts.
CHARS_PER_TOKEN = 4


def estimate_tokens(text: str) -> int:
    """A rough token count of `text` (at least 1 for non-empty text), meant to err high.

    ASCII text: a token per four characters. Other text: a token per four characters
    plus half a token per UTF-8 byte past a character's first, which is
    `(2 * bytes - characters) / 4`: 0.75 a token for a two-byte character (accented
    Latin, Cyrillic, Greek, Arabic, Hebrew), 1.25 for a three-byte one (CJK, kana,
    Hangul, Thai, Indic scripts), 1.75 for a four-byte one (emoji, rare CJK); English
    text with a few curly quotes or arrows gains about a token for each. Assumed: a
    tokenizer that gives a CJK character about one token (roughly 0.6 to 1.3 for today's
    large vocabularies) and other scripts no more than these; the count stays under one
    token a UTF-8 byte, byte-level BPE's limit. Characters/4 alone counted CJK text at
    a quarter of its tokens, and a prompt's first-token budget with it.

    Cost: `str.isascii` answers from a flag CPython keeps, so ASCII text costs what it
    did; other text is encoded once (about 11 us for 30 KB of CJK).
    """
    if text.isascii():
        return -(-len(text) // CHARS_PER_TOKEN)
    # surrogatepass: a lone surrogate (JSON allows "\ud800") is counted, not an error.
    utf8 = len(text.encode("utf-8", "surrogatepass"))
    return -(-(2 * utf8 - len(text)) // CHARS_PER_TOKEN)


def most_tokens(text: str) -> int:
    """The most tokens `text` can be: one per UTF-8 byte, byte-level BPE's limit (every
    token stands for at least one byte). What a budget reserves for a prompt, so that
    no text, however it tokenizes, spends past the reservation (`estimate_tokens` errs
    high for usual text, but text made to tokenize badly can be 4x its estimate)."""
    if text.isascii():
        return len(text)
    return len(text.encode("utf-8", "surrogatepass"))


# What a chat format adds around the messages, in tokens: about 4 per message (role and
# delimiters) and 3 to prime the reply (OpenAI's published count for its chat models).
TOKENS_PER_MESSAGE = 4
TOKENS_PER_REPLY = 3


def estimate_chat_tokens(messages: Iterable[ChatMessage], tools: tuple[Tool, ...] = ()) -> int:
    """A rough token count of chat messages (with their tool calls) and tool definitions
    as a server's own template renders them."""
    return _chat_tokens(messages, tools, estimate_tokens, _tools_tokens)


def most_chat_tokens(messages: Iterable[ChatMessage], tools: tuple[Tool, ...] = ()) -> int:
    """`estimate_chat_tokens` with each text at its most (`most_tokens`)."""
    return _chat_tokens(messages, tools, most_tokens, _most_tools_tokens)


def _chat_tokens(
    messages: Iterable[ChatMessage],
    tools: tuple[Tool, ...],
    count: Callable[[str], int],
    count_tools: Callable[[tuple[Tool, ...]], int],
) -> int:
    total = TOKENS_PER_REPLY
    for message in messages:
        total += TOKENS_PER_MESSAGE + count(message.content)
        for call in message.tool_calls:
            total += count(call.name) + count(call.arguments)
    return total + (count_tools(tools) if tools else 0)


def _count_tools(tools: tuple[Tool, ...]) -> int:
    return sum(estimate_tokens(orjson.dumps(_tool_json(tool)).decode()) for tool in tools)


def _count_most_tools(tools: tuple[Tool, ...]) -> int:
    return sum(len(orjson.dumps(_tool_json(tool))) for tool in tools)


def _tool_json(tool: Tool) -> dict[str, object]:
    return {"name": tool.name, "description": tool.description, "parameters": tool.parameters}


# Counted once per shared tool list: an agent sends the same list every turn
# (`gateway.api.tool_lists`), and counting 20 schemas cost 10 to 15 us a request.
_tools_tokens = ObjectMemo("tokens", _count_tools)
_most_tools_tokens = ObjectMemo("most_tokens", _count_most_tools)


def estimate_request_tokens(request: InferenceRequest) -> int:
    """A rough prompt token count of `request` before any template renders it."""
    if request.kind is RequestKind.CHAT:
        return estimate_chat_tokens(request.messages, request.options.tools)
    if request.kind is RequestKind.EMBEDDING:
        return sum(estimate_tokens(text) for text in request.inputs)
    return estimate_tokens(request.prompt)


def most_request_tokens(request: InferenceRequest) -> int:
    """The most prompt tokens `request` can be, before any template renders it."""
    if request.kind is RequestKind.CHAT:
        return most_chat_tokens(request.messages, request.options.tools)
    if request.kind is RequestKind.EMBEDDING:
        return sum(most_tokens(text) for text in request.inputs)
    return most_tokens(request.prompt)
