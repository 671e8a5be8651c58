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
from gateway.backends.guided import guided_decoding, guided_decoding_parameters
from gateway.backends.http import LazySession, get_ok, post, sse_payloads
from gateway.config.schema import TritonInterface
from gateway.inference.types import (
    Completion,
    Delta,
    RequestKind,
    UpstreamCall,
    Usage,
)


class TritonHTTPBackend:
    """Calls LLM models served by Triton through its generate endpoints.

    What a request's body holds depends on the model's Triton backend (`interface`):
    the generic convention's `text_input`, `max_tokens` and `stream` with sampling as
    request parameters, vLLM's `sampling_parameters`, or TensorRT-LLM's inputs.
    """

    renders_prompt = True

    def __init__(
        self,
        connect_timeout_s: float,
        total_timeout_s: float,
        interface: TritonInterface = TritonInterface.GENERIC,
    ) -> None:
        self._session = LazySession(connect_timeout_s, total_timeout_s)
        self._payload = generate_body[interface]

    async def complete(self, url: str, call: UpstreamCall) -> Completion:
        if call.kind is RequestKind.EMBEDDING:
            return await self._embed(url, call)
        if call.options.top_logprobs is not None:
            # Log probabilities need each token's text: only a stream gives it.
            return await collect(self.stream(url, call), call)
        endpoint = f"{url}/v2/models/{call.upstream_model}/generate"
        async with post(self._session.get(), endpoint, self._payload(call, False)) as r:
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
        async with post(self._session.get(), endpoint, self._payload(call, True)) as r:
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


def _generic_payload(call: UpstreamCall, stream: bool) -> bytes:
    """The generic convention: sampling settings as request parameters (the body's keys
    that name no input), where Triton takes scalars only."""
    params = call.params
    body: dict[str, Any] = {
        "text_input": call.prompt,
        "max_tokens": params.max_tokens,
        "stream": stream,
    }
    _sampling(body, call)
    if params.stop:
        # Triton parameters are scalars, so a list travels as a JSON string.
        body["stop"] = orjson.dumps(list(params.stop)).decode()
    if call.options.response_format is not None:
        body.update(guided_decoding_parameters(call.options.response_format))
    if call.options.top_logprobs is not None:
        body["return_log_probs"] = True  # TensorRT-LLM's input; the simulator's too
    return orjson.dumps(body)


def _vllm_payload(call: UpstreamCall, stream: bool) -> bytes:
    """Triton's vLLM backend: the sampling settings in its `sampling_parameters` input,
    JSON text read as vLLM's SamplingParams (so `stop` is a list, which a request
    parameter cannot be); the prompt left out of a whole answer (vLLM's backend puts it
    first unless told); the token counts asked for."""
    params = call.params
    sampling: dict[str, Any] = {"max_tokens": params.max_tokens}
    _sampling(sampling, call)
    if params.stop:
        sampling["stop"] = list(params.stop)
    if call.options.response_format is not None:
        sampling["guided_decoding"] = guided_decoding(call.options.response_format)
    body = {
        "text_input": call.prompt,
        "stream": stream,
        "exclude_input_in_output": True,
        "return_num_input_tokens": True,
        "return_num_output_tokens": True,
        "sampling_parameters": orjson.dumps(sampling).decode(),
    }
    return orjson.dumps(body)


def _tensorrtllm_payload(call: UpstreamCall, stream: bool) -> bytes:
    """TensorRT-LLM's in-flight batcher (`ensemble` or `tensorrt_llm_bls`): each setting
    an input of its own, stop strings as the `stop_words` list, the prompt left out.
    Output tokens are counted per answer, not per streamed piece (one token a piece)."""
    params = call.params
    body: dict[str, Any] = {
        "text_input": call.prompt,
        "max_tokens": params.max_tokens,
        "stream": stream,
        "exclude_input_in_output": True,
        "return_num_input_tokens": True,
        "return_num_output_tokens": not stream,
    }
    _sampling(body, call)
    if params.seed is not None:
        # Its `seed` input is UINT64: a negative seed as the same 64 bits, unsigned (Triton
        # answered -1 with a 500, which ejected the replica for every tenant: issue 42's
        # hostile review). One seed still gives one sequence.
        body["seed"] = params.seed & _UINT64
    if params.stop:
        body["stop_words"] = list(params.stop)
    if call.options.response_format is not None:
        guided = guided_decoding_parameters(call.options.response_format)
        body["guided_decoding_guide_type"] = guided["guided_decoding_guide_type"]
        body["guided_decoding_guide"] = guided["guided_decoding_guide"]
    if call.options.top_logprobs is not None:
        body["return_log_probs"] = True
    return orjson.dumps(body)


_UINT64 = (1 << 64) - 1


def _sampling(body: dict[str, Any], call: UpstreamCall) -> None:
    """temperature, top_p and seed, where the request sets them."""
    params = call.params
    if params.temperature is not None:
        body["temperature"] = params.temperature
    if params.top_p is not None:
        body["top_p"] = params.top_p
    if params.seed is not None:
        body["seed"] = params.seed


# The body of a generate request, by the model's Triton backend: (call, stream) -> JSON.
generate_body = {
    TritonInterface.GENERIC: _generic_payload,
    TritonInterface.VLLM: _vllm_payload,
    TritonInterface.TENSORRTLLM: _tensorrtllm_payload,
}


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
