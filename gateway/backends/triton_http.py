"""Triton's HTTP generate extension: `/generate` and `/generate_stream` (SSE)."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import orjson

from gateway.backends.base import (
    BAD_ANSWER,
    UpstreamError,
    collect,
    embedding_completion,
    model_error,
    token_logprobs,
)
from gateway.backends.guided import guided_decoding_parameters
from gateway.backends.http import LazySession, get_ok, post, sse_payloads
from gateway.inference.types import (
    Completion,
    Delta,
    RequestKind,
    UpstreamCall,
    Usage,
)


class TritonHTTPBackend:
    """Calls LLM models served by Triton through its generate endpoints.

    The model takes `text_input`, `max_tokens` and `stream` (the convention of Triton's
    vLLM and TensorRT-LLM backends); sampling settings travel as request parameters.
    """

    renders_prompt = True

    def __init__(self, connect_timeout_s: float, total_timeout_s: float) -> None:
        self._session = LazySession(connect_timeout_s, total_timeout_s)

    async def complete(self, url: str, call: UpstreamCall) -> Completion:
        if call.kind is RequestKind.EMBEDDING:
            return await self._embed(url, call)
        if call.options.top_logprobs is not None:
            # Log probabilities need each token's text: only a stream gives it.
            return await collect(self.stream(url, call), call)
        endpoint = f"{url}/v2/models/{call.upstream_model}/generate"
        async with post(self._session.get(), endpoint, _payload(call, False)) as r:
            data = orjson.loads(await r.read())
        delta = _delta(data, before_output=True)
        usage = Usage(delta.input_tokens or 0, delta.output_tokens or 0, delta.cached_tokens)
        return Completion(
            text=delta.text, usage=usage, finish_reason=call.finish_reason(usage.completion_tokens)
        )

    async def _embed(self, url: str, call: UpstreamCall) -> Completion:
        """The standard `infer` API (KServe v2): a BYTES tensor of texts in, the outputs
        back as raw bytes (Triton's binary tensor extension), which costs a fraction of
        parsing thousands of JSON numbers."""
        input_tensor = call.tensors[0]
        body = {
            "inputs": [
                {
                    "name": input_tensor,
                    "shape": [len(call.inputs)],
                    "datatype": "BYTES",
                    "data": list(call.inputs),
                }
            ],
            "parameters": {"binary_data_output": True},
        }
        endpoint = f"{url}/v2/models/{call.upstream_model}/infer"
        async with post(self._session.get(), endpoint, orjson.dumps(body)) as r:
            raw = await r.read()
            header_length = r.headers.get("Inference-Header-Content-Length")
        return embedding_completion(_infer_outputs(raw, header_length), call)

    async def stream(self, url: str, call: UpstreamCall) -> AsyncGenerator[Delta, None]:
        endpoint = f"{url}/v2/models/{call.upstream_model}/generate_stream"
        async with post(self._session.get(), endpoint, _payload(call, True)) as r:
            first = True
            async for payload in sse_payloads(r):
                yield _delta(orjson.loads(payload), before_output=first)
                first = False

    async def ready(self, url: str, upstream_model: str, timeout_s: float) -> bool:
        return await get_ok(
            self._session.get(), f"{url}/v2/models/{upstream_model}/ready", timeout_s
        )

    async def close(self) -> None:
        await self._session.close()


def _infer_outputs(raw: bytes, header_length: str | None) -> dict[str, Any]:
    """An `infer` answer's outputs by name: raw bytes for those sent in binary (after the
    JSON header of `header_length` bytes), else their JSON `data`."""
    size = int(header_length) if header_length is not None else len(raw)
    try:
        header = orjson.loads(raw[:size])
    except orjson.JSONDecodeError as exc:
        raise UpstreamError(BAD_ANSWER, f"malformed infer answer: {exc}") from exc
    if "error" in header:
        raise model_error(str(header["error"]), before_output=True)
    outputs: dict[str, Any] = {}
    offset = size
    for output in header.get("outputs", []):
        binary = (output.get("parameters") or {}).get("binary_data_size")
        if binary is None:
            outputs[output.get("name")] = output.get("data")
        else:
            outputs[output.get("name")] = raw[offset : offset + binary]
            offset += binary
    return outputs


def _payload(call: UpstreamCall, stream: bool) -> bytes:
    params = call.params
    body: dict[str, Any] = {
        "text_input": call.prompt,
        "max_tokens": params.max_tokens,
        "stream": stream,
    }
    if params.temperature is not None:
        body["temperature"] = params.temperature
    if params.top_p is not None:
        body["top_p"] = params.top_p
    if params.seed is not None:
        body["seed"] = params.seed
    if params.stop:
        # Triton parameters are scalars, so a list travels as a JSON string.
        body["stop"] = orjson.dumps(list(params.stop)).decode()
    if call.options.response_format is not None:
        body.update(guided_decoding_parameters(call.options.response_format))
    if call.options.top_logprobs is not None:
        body["return_log_probs"] = True  # TensorRT-LLM's input; the simulator's too
    return orjson.dumps(body)


def _scalar(value: Any) -> Any:
    # Triton returns a [1]-shaped output as a bare value or as a one-element list.
    if isinstance(value, list):
        return value[0] if value else None
    return value


def _delta(data: dict[str, Any], before_output: bool) -> Delta:
    error = data.get("error")
    if error is not None:
        # Triton reports a model's failure inside a 200 response, even mid-stream.
        raise model_error(str(error), before_output)
    text = data.get("text_output")
    if not isinstance(text, str):  # a list, or missing
        text = _scalar(text)
        text = text if isinstance(text, str) else ""
    # Per piece of a stream: the counts are read only when the server sends them.
    output_tokens = data.get("num_output_tokens")
    input_tokens = data.get("num_input_tokens")
    cached_tokens = data.get("num_cached_tokens")
    logprobs = data.get("output_log_probs")
    return Delta(
        text=text,
        output_tokens=None if output_tokens is None else _count(output_tokens),
        input_tokens=None if input_tokens is None else _count(input_tokens),
        cached_tokens=None if cached_tokens is None else _count(cached_tokens),
        logprobs=None if logprobs is None else token_logprobs(text, _list(logprobs)),
    )


def _count(value: Any) -> int | None:
    """A token count output: a number, or a one-element list of one (an empty list: None)."""
    value = _scalar(value)
    return None if value is None else int(value)


def _list(value: Any) -> list[float]:
    return value if isinstance(value, list) else [value]
