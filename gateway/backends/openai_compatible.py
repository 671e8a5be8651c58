"""Any OpenAI-compatible upstream: vLLM, TGI, Triton's OpenAI frontend, or another gateway."""

from __future__ import annotations

import base64
from collections.abc import AsyncGenerator
from typing import Any

import numpy as np
import orjson

from gateway.backends.base import (
    BAD_ANSWER,
    CONNECTION_LOST,
    REPORTED_ERROR,
    ReplicaUnavailable,
    UpstreamError,
)
from gateway.backends.http import LazySession, credential, get_ok, post, sse_payloads
from gateway.inference.memo import ObjectMemo
from gateway.inference.types import (
    ChatMessage,
    Completion,
    Delta,
    RequestKind,
    ResponseFormat,
    Tool,
    ToolCall,
    ToolCallDelta,
    UpstreamCall,
    Usage,
    Vectors,
)


class OpenAIBackend:
    """Forwards chat and text completions to `{url}/v1/...`, renaming the model.

    The replica URL may end in `/v1` or not (`http://vllm:8000` or `http://vllm:8000/v1`).
    """

    renders_prompt = False

    def __init__(
        self, connect_timeout_s: float, total_timeout_s: float, api_key: str | None = None
    ) -> None:
        headers = {"authorization": f"Bearer {api_key}"} if api_key else None
        self._session = LazySession(connect_timeout_s, total_timeout_s, headers)

    async def complete(self, url: str, call: UpstreamCall) -> Completion:
        if call.kind is RequestKind.EMBEDDING:
            return await self._embed(url, call)
        async with post(self._session.get(), _endpoint(url, call), _payload(call, False)) as r:
            data = orjson.loads(await r.read())
        try:
            choice = data["choices"][0]
            tool_calls: tuple[ToolCall, ...] = ()
            logprobs = None
            if call.kind is RequestKind.CHAT:
                text = choice["message"].get("content") or ""
                tool_calls = _tool_calls(choice["message"].get("tool_calls"))
                logprobs = _logprobs(choice)
            else:
                text = choice["text"]
        except (KeyError, IndexError, TypeError) as exc:
            raise UpstreamError(BAD_ANSWER, f"malformed upstream response: {exc!r}") from exc
        usage = _usage(data.get("usage"))
        return Completion(
            text=text,
            usage=usage or Usage(),
            finish_reason=choice.get("finish_reason") or "stop",
            tool_calls=tool_calls,
            logprobs=logprobs,
        )

    async def _embed(self, url: str, call: UpstreamCall) -> Completion:
        body: dict[str, Any] = {
            "model": call.upstream_model,
            "input": list(call.inputs),
            # Four bytes a number instead of about twenty characters, and no float parsing.
            "encoding_format": "base64",
        }
        if call.dimensions is not None:
            body["dimensions"] = call.dimensions
        endpoint = _api_base(url) + "/embeddings"
        async with post(self._session.get(), endpoint, orjson.dumps(body)) as r:
            data = orjson.loads(await r.read())
        try:
            rows = sorted(data["data"], key=lambda row: row["index"])
            vectors = np.stack([_vector(row["embedding"]) for row in rows])
        except (KeyError, TypeError, ValueError) as exc:
            raise UpstreamError(BAD_ANSWER, f"malformed upstream response: {exc!r}") from exc
        if len(vectors) != len(call.inputs):
            detail = f"{len(vectors)} vectors for {len(call.inputs)} inputs"
            raise UpstreamError(BAD_ANSWER, detail)
        return Completion(text="", usage=_usage(data.get("usage")) or Usage(), vectors=vectors)

    async def stream(self, url: str, call: UpstreamCall) -> AsyncGenerator[Delta, None]:
        session = self._session.get()
        async with post(session, _endpoint(url, call), _payload(call, True)) as r:
            try:
                async for payload in sse_payloads(r):
                    if payload == b"[DONE]":
                        return
                    delta = _chunk_delta(orjson.loads(payload), call.kind)
                    if delta is not None:
                        yield delta
            except UpstreamError as exc:  # an error event may quote the key it was sent
                token = credential(session)
                if token:
                    exc.detail = exc.detail.replace(token, "[REDACTED]")
                raise
        # An OpenAI stream ends with `[DONE]`: a body that ended before it was cut (a
        # connection closed mid-answer, which without chunked framing reads as an end).
        raise ReplicaUnavailable(CONNECTION_LOST, "the stream ended without [DONE]")

    async def ready(self, url: str, upstream_model: str, timeout_s: float) -> bool:
        return await get_ok(self._session.get(), f"{_api_base(url)}/models", timeout_s)

    async def close(self) -> None:
        await self._session.close()


def _vector(embedding: str | list[float]) -> Vectors:
    """A vector as an OpenAI server sends it: base64 of float32 bytes, or numbers."""
    if isinstance(embedding, str):
        return np.frombuffer(base64.b64decode(embedding), dtype="<f4")
    return np.asarray(embedding, dtype=np.float32)


def _api_base(url: str) -> str:
    """`http://host:port/v1` from the replica URL, given with or without its `/v1`."""
    base = url.rstrip("/")
    return base if base.endswith("/v1") else base + "/v1"


def _endpoint(url: str, call: UpstreamCall) -> str:
    path = "/chat/completions" if call.kind is RequestKind.CHAT else "/completions"
    return _api_base(url) + path


def _payload(call: UpstreamCall, stream: bool) -> bytes:
    params = call.params
    body: dict[str, Any] = {"model": call.upstream_model, "max_tokens": params.max_tokens}
    if call.kind is RequestKind.CHAT:
        body["messages"] = [_message(m) for m in call.messages]
        options = call.options
        if options.tools:
            body["tools"] = _tools_json(options.tools)
        if options.tool_choice is not None:
            body["tool_choice"] = (
                {"type": "function", "function": {"name": options.forced_tool}}
                if options.forced_tool is not None
                else options.tool_choice
            )
        if options.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = options.parallel_tool_calls
        if options.response_format is not None:
            body["response_format"] = _response_format(options.response_format)
        if options.top_logprobs is not None:
            body["logprobs"] = True
            if options.top_logprobs:
                body["top_logprobs"] = options.top_logprobs
    else:
        body["prompt"] = call.prompt
    if stream:
        body["stream"] = True
        # Ask for usage so the gateway charges what was generated, not an estimate.
        body["stream_options"] = {"include_usage": True}
    for name in ("temperature", "top_p", "seed"):
        value = getattr(params, name)
        if value is not None:
            body[name] = value
    if params.stop:
        body["stop"] = list(params.stop)
    return orjson.dumps(body)


def _message(message: ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
        out["content"] = message.content or None
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


def _response_format(fmt: ResponseFormat) -> dict[str, Any]:
    if fmt.type == "json_object":
        return {"type": "json_object"}
    spec: dict[str, Any] = {"name": fmt.name, "schema": fmt.schema}
    if fmt.strict is not None:
        spec["strict"] = fmt.strict
    if fmt.description is not None:
        spec["description"] = fmt.description
    return {"type": "json_schema", "json_schema": spec}


def _serialized_tools(tools: tuple[Tool, ...]) -> orjson.Fragment:
    """The tools as chat's JSON, made once per shared tool list (an agent's tools are
    the same list object on every turn: `gateway.api.tool_lists`)."""
    return orjson.Fragment(orjson.dumps([_tool(t) for t in tools]))


_tools_json = ObjectMemo("openai_json", _serialized_tools)


def _tool(tool: Tool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name}
    if tool.description is not None:
        function["description"] = tool.description
    if tool.parameters is not None:
        function["parameters"] = tool.parameters
    if tool.strict is not None:
        function["strict"] = tool.strict
    return {"type": "function", "function": function}


def _tool_calls(raw: object) -> tuple[ToolCall, ...]:
    """A response message's `tool_calls`."""
    if not raw:
        return ()
    if not isinstance(raw, list):
        raise UpstreamError(BAD_ANSWER, "malformed upstream response: tool_calls is not a list")
    try:
        return tuple(
            ToolCall(c["id"], c["function"]["name"], c["function"].get("arguments") or "")
            for c in raw
        )
    except (KeyError, TypeError) as exc:
        raise UpstreamError(BAD_ANSWER, f"malformed upstream tool call: {exc!r}") from exc


def _tool_call_deltas(raw: object) -> tuple[ToolCallDelta, ...]:
    """A stream chunk's `delta.tool_calls` fragments."""
    if not raw:
        return ()
    if not isinstance(raw, list):
        raise UpstreamError(BAD_ANSWER, "malformed upstream chunk: tool_calls is not a list")
    deltas = []
    for fragment in raw:
        if not isinstance(fragment, dict) or not isinstance(fragment.get("index"), int):
            detail = "malformed upstream chunk: a tool call fragment has no index"
            raise UpstreamError(BAD_ANSWER, detail)
        function = fragment.get("function") or {}
        deltas.append(
            ToolCallDelta(
                index=fragment["index"],
                id=fragment.get("id"),
                name=function.get("name"),
                arguments=function.get("arguments") or "",
            )
        )
    return tuple(deltas)


def _logprobs(choice: dict[str, Any]) -> list[Any] | None:
    """A choice's `logprobs.content` entries, as they came."""
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    return content if isinstance(content, list) else None


def _usage(raw: object) -> Usage | None:
    if not isinstance(raw, dict):
        return None
    details = raw.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(
        prompt_tokens=int(raw.get("prompt_tokens") or 0),
        completion_tokens=int(raw.get("completion_tokens") or 0),
        cached_tokens=None if cached is None else int(cached),
    )


def _chunk_delta(chunk: dict[str, Any], kind: RequestKind) -> Delta | None:
    if "error" in chunk:
        # An error event in the stream: what it says (an exception's text, often) is only
        # logged.
        error = chunk["error"]
        said = error.get("message", error) if isinstance(error, dict) else error
        raise UpstreamError(REPORTED_ERROR, f"error event: {said}")
    usage = _usage(chunk.get("usage"))
    choices = chunk.get("choices") or []
    if not choices:
        if usage is None:
            return None
        # The trailing usage chunk: exact totals, no text.
        return Delta(text="", usage=usage)
    choice = choices[0]
    tool_calls: tuple[ToolCallDelta, ...] = ()
    logprobs = None
    if kind is RequestKind.CHAT:
        delta = choice.get("delta") or {}
        text = delta.get("content") or ""
        tool_calls = _tool_call_deltas(delta.get("tool_calls"))
        logprobs = _logprobs(choice)
    else:
        text = choice.get("text") or ""
    return Delta(
        text=text,
        output_tokens=1 if text or tool_calls else 0,
        finish_reason=choice.get("finish_reason"),
        tool_calls=tool_calls,
        logprobs=logprobs,
    )
