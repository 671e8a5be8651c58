"""OpenAI response bodies and SSE chunks for chat and text completions."""

from __future__ import annotations

import time
from typing import Any

import orjson

from gateway.inference.ids import random_id
from gateway.inference.types import (
    Completion,
    InferenceRequest,
    RequestKind,
    ToolCall,
    ToolCallDelta,
    Usage,
)

SSE_DONE = b"data: [DONE]\n\n"


def new_id(kind: RequestKind) -> str:
    prefix = "chatcmpl-" if kind is RequestKind.CHAT else "cmpl-"
    return prefix + random_id()


def _usage(usage: Usage) -> dict[str, int]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }


def completion_body(
    request: InferenceRequest, completion: Completion, *, response_id: str, model: str
) -> bytes:
    """The JSON body of a non-streamed response."""
    choice: dict[str, Any]
    if request.kind is RequestKind.CHAT:
        message: dict[str, Any] = {"role": "assistant", "content": completion.text}
        if completion.tool_calls:
            # As OpenAI answers a turn of calls: content null unless the model also wrote.
            message["content"] = completion.text or None
            message["tool_calls"] = [_tool_call(call) for call in completion.tool_calls]
        logprobs = None
        if request.options.top_logprobs is not None:
            logprobs = {"content": completion.logprobs or [], "refusal": None}
        choice = {
            "index": 0,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": completion.finish_reason,
        }
        obj = "chat.completion"
    else:
        choice = {
            "index": 0,
            "text": completion.text,
            "logprobs": None,
            "finish_reason": completion.finish_reason,
        }
        obj = "text_completion"
    return orjson.dumps(
        {
            "id": response_id,
            "object": obj,
            "created": int(time.time()),
            "model": model,
            "choices": [choice],
            "usage": _usage(completion.usage),
        }
    )


def _tool_call(call: ToolCall) -> dict[str, Any]:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


class ChunkWriter:
    """Builds the SSE events of one streamed response.

    Every chunk of one response shares its id, creation time and model, so the
    constant part is kept here and only the choice changes per event.
    """

    def __init__(self, request: InferenceRequest, *, response_id: str, model: str) -> None:
        self._chat = request.kind is RequestKind.CHAT
        self._head: dict[str, Any] = {
            "id": response_id,
            "object": "chat.completion.chunk" if self._chat else "text_completion",
            "created": int(time.time()),
            "model": model,
        }
        self._role_sent = False

    def _event(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return b"data: " + orjson.dumps({**self._head, "choices": choices, **extra}) + b"\n\n"

    def text(self, text: str, logprobs: list[Any] | None = None) -> bytes:
        """An event carrying generated text (and its tokens' log probabilities)."""
        if self._chat:
            delta: dict[str, str] = {"content": text}
            if not self._role_sent:
                # OpenAI sends the role once, on the first chunk.
                delta = {"role": "assistant", "content": text}
                self._role_sent = True
            choice: dict[str, Any] = {
                "index": 0,
                "delta": delta,
                "logprobs": None if logprobs is None else {"content": logprobs, "refusal": None},
                "finish_reason": None,
            }
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": None}
        return self._event([choice])

    def tool_calls(self, fragments: tuple[ToolCallDelta, ...]) -> bytes:
        """An event carrying pieces of tool calls: a call's first piece has its id, type
        and name (and arguments so far), later pieces only more of its arguments."""
        calls = []
        for fragment in fragments:
            call: dict[str, Any] = {"index": fragment.index}
            function: dict[str, str] = {"arguments": fragment.arguments}
            if fragment.id is not None:
                call["id"], call["type"] = fragment.id, "function"
            if fragment.name is not None:
                function["name"] = fragment.name
            call["function"] = function
            calls.append(call)
        delta: dict[str, Any] = {"tool_calls": calls}
        if not self._role_sent:
            delta = {"role": "assistant", "content": None, "tool_calls": calls}
            self._role_sent = True
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        return self._event([choice])

    def finish(self, finish_reason: str) -> bytes:
        """The event that closes the choice."""
        if self._chat:
            delta = {} if self._role_sent else {"role": "assistant", "content": ""}
            choice: dict[str, Any] = {
                "index": 0,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        else:
            choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": finish_reason}
        return self._event([choice])

    def usage(self, usage: Usage) -> bytes:
        """The trailing usage event (`stream_options.include_usage`)."""
        return self._event([], usage=_usage(usage))


def sse_error(body: dict[str, object]) -> bytes:
    """A terminal error event; the openai SDK raises it as an APIError."""
    return b"data: " + orjson.dumps(body) + b"\n\n"
