"""OpenAI response bodies and SSE chunks for chat and text completions."""

from __future__ import annotations

import base64
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson

from gateway.api.errors import APIError, upstream_failed
from gateway.inference.types import (
    Completion,
    InferenceRequest,
    RequestKind,
    ToolCall,
    ToolCallDelta,
    Usage,
    Vectors,
)

SSE_DONE = b"data: [DONE]\n\n"


def _usage(usage: Usage) -> dict[str, Any]:
    body: dict[str, Any] = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }
    if usage.cached_tokens is not None:  # as OpenAI reports its prompt caching
        body["prompt_tokens_details"] = {"cached_tokens": usage.cached_tokens}
    return body


def completion_body(
    parts: Sequence[InferenceRequest],
    completions: Sequence[Completion],
    *,
    response_id: str,
    model: str,
) -> bytes:
    """The JSON body of a non-streamed response: choice `i` is `completions[i]`, the
    answer to `parts[i]`; the usage is theirs together."""
    request = parts[0]
    chat = request.kind is RequestKind.CHAT
    choices = [
        _chat_choice(request, index, completion) if chat else _text_choice(part, index, completion)
        for index, (part, completion) in enumerate(zip(parts, completions, strict=True))
    ]
    usage = completions[0].usage
    if len(completions) > 1:
        usage = Usage.sum_of(c.usage for c in completions)
    return orjson.dumps(
        {
            "id": response_id,
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": choices,
            "usage": _usage(usage),
        }
    )


def _chat_choice(request: InferenceRequest, index: int, completion: Completion) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": completion.text}
    if completion.tool_calls:
        # As OpenAI answers a turn of calls: content null unless the model also wrote.
        message["content"] = completion.text or None
        message["tool_calls"] = [_tool_call(call) for call in completion.tool_calls]
    logprobs = None
    if request.options.top_logprobs is not None:
        logprobs = {"content": completion.logprobs or [], "refusal": None}
    return {
        "index": index,
        "message": message,
        "logprobs": logprobs,
        "finish_reason": completion.finish_reason,
    }


def _text_choice(part: InferenceRequest, index: int, completion: Completion) -> dict[str, Any]:
    return {
        "index": index,
        "text": part.prompt + completion.text if part.echo else completion.text,
        "logprobs": None,
        "finish_reason": completion.finish_reason,
    }


def embeddings_body(
    parts: Sequence[InferenceRequest],
    completions: Sequence[Completion],
    *,
    response_id: str,
    model: str,
) -> bytes:
    """The JSON body of `/v1/embeddings`: one vector per input of every part, in order,
    as numbers or base64; a 502 when the backend did not give one vector per input."""
    request = parts[0]
    vectors = _vectors(parts, completions, model)
    prompt_tokens = sum(c.usage.prompt_tokens for c in completions)
    if request.base64:
        data: list[dict[str, Any]] = [
            {
                "object": "embedding",
                "index": i,
                "embedding": base64.b64encode(row.tobytes()).decode(),
            }
            for i, row in enumerate(vectors.astype("<f4", copy=False))
        ]
    else:
        data = [
            {"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(vectors)
        ]
    return orjson.dumps(
        {
            "object": "list",
            "data": data,
            "model": model,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        },
        option=orjson.OPT_SERIALIZE_NUMPY,
    )


def _vectors(
    parts: Sequence[InferenceRequest], completions: Sequence[Completion], model: str
) -> Vectors:
    """The vectors of every input, in order, `dimensions` long."""
    batches = []
    for part, completion in zip(parts, completions, strict=True):
        if completion.vectors is None or len(completion.vectors) != len(part.inputs):
            raise upstream_failed(model, "the backend did not return one vector per input")
        batches.append(completion.vectors)
    rows = np.concatenate(batches) if len(batches) > 1 else batches[0]
    dimensions = parts[0].dimensions
    if dimensions is not None and rows.shape[1] > dimensions:
        # A Matryoshka model's leading coordinates, made unit vectors again.
        rows = rows[:, :dimensions]
        norms = np.linalg.norm(rows, axis=1, keepdims=True)
        rows = (rows / np.where(norms == 0, 1, norms)).astype(np.float32)
    return rows


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
        self._include_usage = request.include_usage
        self._head: dict[str, Any] = {
            "id": response_id,
            "object": "chat.completion.chunk" if self._chat else "text_completion",
            "created": int(time.time()),
            "model": model,
        }
        # The choices that have had their first chunk (OpenAI sends the role once).
        self._started: set[int] = set()

    def _event(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return b"data: " + orjson.dumps({**self._head, "choices": choices, **extra}) + b"\n\n"

    def text(self, text: str, logprobs: list[Any] | None = None, index: int = 0) -> bytes:
        """An event carrying generated text (and its tokens' log probabilities)."""
        if self._chat:
            delta: dict[str, str] = {"content": text}
            if index not in self._started:
                # OpenAI sends the role once, on the first chunk.
                delta = {"role": "assistant", "content": text}
                self._started.add(index)
            choice: dict[str, Any] = {
                "index": index,
                "delta": delta,
                "logprobs": None if logprobs is None else {"content": logprobs, "refusal": None},
                "finish_reason": None,
            }
        else:
            choice = {"index": index, "text": text, "logprobs": None, "finish_reason": None}
        return self._event([choice])

    def tool_calls(self, fragments: tuple[ToolCallDelta, ...], index: int = 0) -> bytes:
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
        if index not in self._started:
            delta = {"role": "assistant", "content": None, "tool_calls": calls}
            self._started.add(index)
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
        return self._event([choice])

    def finish(self, finish_reason: str, index: int = 0) -> bytes:
        """The event that closes the choice."""
        if self._chat:
            delta = {} if index in self._started else {"role": "assistant", "content": ""}
            choice: dict[str, Any] = {
                "index": index,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        else:
            choice = {"index": index, "text": "", "logprobs": None, "finish_reason": finish_reason}
        return self._event([choice])

    def usage(self, usage: Usage) -> bytes:
        """The trailing usage event (`stream_options.include_usage`)."""
        return self._event([], usage=_usage(usage))

    def start(self) -> bytes:
        """Events before the first piece: none (the first chunk carries the role)."""
        return b""

    def close(self, finish_reason: str, usage: Usage) -> bytes:
        """The stream's last events, in one write: the finish, the usage if asked for,
        and `[DONE]`."""
        events = self.finish(finish_reason)
        if self._include_usage:
            events += self.usage(usage)
        return events + SSE_DONE

    def error(self, error: APIError) -> bytes:
        """A terminal error event."""
        return sse_error(error.body())

    def answer(self) -> dict[str, Any] | None:
        """Chat answers are not kept."""
        return None


def sse_error(body: dict[str, object]) -> bytes:
    """A terminal error event; the openai SDK raises it as an APIError."""
    return b"data: " + orjson.dumps(body) + b"\n\n"
