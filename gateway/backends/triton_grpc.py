"""Triton over gRPC: `ModelStreamInfer` on a pooled channel per replica.

`tritonclient.grpc.aio.stream_infer` cannot ask for Triton's empty final response, so it
cannot tell when a request is finished; the raw stub from `tritonclient.grpc` can.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncGenerator, AsyncIterator

import grpc
import numpy as np
import orjson
from tritonclient.grpc import service_pb2, service_pb2_grpc

from gateway.backends.base import (
    CONNECT_FAILED,
    CONNECTION_LOST,
    TIMED_OUT,
    ReplicaUnavailable,
    UpstreamError,
    UpstreamRejected,
    UpstreamTimeout,
    collect,
    embedding_completion,
    model_error,
    plain_reason,
    token_logprobs,
)
from gateway.backends.guided import guided_decoding_parameters
from gateway.inference.types import (
    Completion,
    Delta,
    RequestKind,
    UpstreamCall,
)
from gateway.observability import tracing

_UNAVAILABLE = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.RESOURCE_EXHAUSTED}
)
_INT32 = struct.Struct("<i")


class TritonGRPCBackend:
    """Calls decoupled LLM models on Triton through bidirectional gRPC streams."""

    renders_prompt = True

    def __init__(self, connect_timeout_s: float, total_timeout_s: float) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}
        # Channels seen connected; the others wait at most connect_timeout_s to connect.
        self._connected: set[str] = set()
        self._connect_timeout_s = connect_timeout_s
        self._total_timeout_s = total_timeout_s

    def _channel(self, url: str) -> grpc.aio.Channel:
        channel = self._channels.get(url)
        if channel is None:
            channel = grpc.aio.insecure_channel(
                url.removeprefix("grpc://"),
                options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)],
            )
            self._channels[url] = channel
        return channel

    def _stub(self, url: str) -> service_pb2_grpc.GRPCInferenceServiceStub:
        return service_pb2_grpc.GRPCInferenceServiceStub(self._channel(url))

    async def _connected_stub(self, url: str) -> service_pb2_grpc.GRPCInferenceServiceStub:
        """The stub once the channel is connected: ReplicaUnavailable if the connection
        fails, or is not made within connect_s.

        Checked on first use and after a failure only: a call on a channel seen
        connected costs nothing more.
        """
        channel = self._channel(url)
        if url not in self._connected:
            try:
                state = await asyncio.wait_for(_connect(channel), self._connect_timeout_s)
            except TimeoutError:
                detail = f"gRPC: no connection to {url} within {self._connect_timeout_s:g} s"
                raise ReplicaUnavailable(CONNECT_FAILED, detail) from None
            if state is not grpc.ChannelConnectivity.READY:
                detail = f"gRPC: cannot connect to {url} ({state.name})"
                raise ReplicaUnavailable(CONNECT_FAILED, detail)
            self._connected.add(url)
        return service_pb2_grpc.GRPCInferenceServiceStub(channel)

    async def complete(self, url: str, call: UpstreamCall) -> Completion:
        if call.kind is RequestKind.EMBEDDING:
            return await self._embed(url, call)
        # Log probabilities need each token's text: only a stream gives it.
        stream = call.options.top_logprobs is not None
        return await collect(self._generate(url, call, stream=stream), call)

    async def _embed(self, url: str, call: UpstreamCall) -> Completion:
        """The standard unary `ModelInfer`: a BYTES tensor of texts in, raw FP32 out."""
        input_tensor = call.tensors[0]
        request = service_pb2.ModelInferRequest(model_name=call.upstream_model)
        texts = request.inputs.add(name=input_tensor, datatype="BYTES", shape=[len(call.inputs)])
        texts.contents.bytes_contents.extend(text.encode() for text in call.inputs)
        stub = await self._connected_stub(url)
        try:
            result = await stub.ModelInfer(
                request, timeout=self._total_timeout_s, metadata=_trace_metadata()
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.UNAVAILABLE:
                self._connected.discard(url)
            raise _error(exc) from exc
        raw = dict(zip((o.name for o in result.outputs), result.raw_output_contents, strict=False))
        return embedding_completion(raw, call)

    def stream(self, url: str, call: UpstreamCall) -> AsyncGenerator[Delta, None]:
        return self._generate(url, call, stream=True)

    async def _generate(
        self, url: str, call: UpstreamCall, stream: bool
    ) -> AsyncGenerator[Delta, None]:
        request = _request(call, stream)

        async def requests() -> AsyncIterator[service_pb2.ModelInferRequest]:
            yield request

        stub = await self._connected_stub(url)
        responses = stub.ModelStreamInfer(
            requests(), timeout=self._total_timeout_s, metadata=_trace_metadata()
        )
        before_output = True
        try:
            async for response in responses:
                if response.error_message:
                    raise model_error(response.error_message, before_output)
                result = response.infer_response
                if result.outputs:
                    before_output = False
                    yield _delta(result)
                if result.parameters["triton_final_response"].bool_param:
                    return
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.UNAVAILABLE:
                self._connected.discard(url)  # the next call waits for a connection again
            raise _error(exc) from exc
        finally:
            responses.cancel()

    async def ready(self, url: str, upstream_model: str, timeout_s: float) -> bool:
        try:
            reply = await self._stub(url).ModelReady(
                service_pb2.ModelReadyRequest(name=upstream_model), timeout=timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.UNAVAILABLE:
                self._connected.discard(url)
            return False
        return bool(reply.ready)

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        self._connected.clear()


def _trace_metadata() -> tuple[tuple[str, str], ...] | None:
    """A traced request's context, as gRPC metadata (Triton reads `traceparent` there)."""
    traceparent = tracing.upstream_traceparent()
    return None if traceparent is None else ((tracing.TRACEPARENT_HEADER, traceparent),)


async def _connect(channel: grpc.aio.Channel) -> grpc.ChannelConnectivity:
    """Wait while the channel connects: READY, or the failure it ended in."""
    state = channel.get_state(try_to_connect=True)
    while state in (grpc.ChannelConnectivity.IDLE, grpc.ChannelConnectivity.CONNECTING):
        await channel.wait_for_state_change(state)
        state = channel.get_state(try_to_connect=True)
    return state


def _request(call: UpstreamCall, stream: bool) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=call.upstream_model)
    text = request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    text.contents.bytes_contents.append(call.prompt.encode())
    max_tokens = request.inputs.add(name="max_tokens", datatype="INT32", shape=[1])
    max_tokens.contents.int_contents.append(call.params.max_tokens)
    flag = request.inputs.add(name="stream", datatype="BOOL", shape=[1])
    flag.contents.bool_contents.append(stream)
    params = request.parameters
    params["triton_enable_empty_final_response"].bool_param = True
    if call.params.temperature is not None:
        params["temperature"].double_param = call.params.temperature
    if call.params.top_p is not None:
        params["top_p"].double_param = call.params.top_p
    if call.params.seed is not None:
        params["seed"].int64_param = call.params.seed
    if call.params.stop:
        params["stop"].string_param = orjson.dumps(list(call.params.stop)).decode()
    if call.options.response_format is not None:
        for name, value in guided_decoding_parameters(call.options.response_format).items():
            params[name].string_param = value
    if call.options.top_logprobs is not None:
        params["return_log_probs"].bool_param = True
    return request


def _delta(result: service_pb2.ModelInferResponse) -> Delta:
    delta = Delta(text="")
    logprobs: list[float] | None = None
    for output, raw in zip(result.outputs, result.raw_output_contents, strict=False):
        if output.name == "text_output":
            # A BYTES tensor is serialized as a 4-byte little-endian length, then the bytes.
            (length,) = _INT32.unpack_from(raw, 0)
            delta.text = raw[4 : 4 + length].decode(errors="replace")
        elif output.name == "num_output_tokens":
            delta.output_tokens = _INT32.unpack_from(raw, 0)[0]
        elif output.name == "num_input_tokens":
            delta.input_tokens = _INT32.unpack_from(raw, 0)[0]
        elif output.name == "num_cached_tokens":
            delta.cached_tokens = _INT32.unpack_from(raw, 0)[0]
        elif output.name == "output_log_probs":
            logprobs = np.frombuffer(raw, dtype="<f4").tolist()
    if logprobs is not None:  # after the loop: it names the text of its tokens
        delta.logprobs = token_logprobs(delta.text, logprobs)
    return delta


def _error(exc: grpc.aio.AioRpcError) -> UpstreamError:
    """The failure a gRPC status stands for. The client is told its kind, or the status
    code's name; the status's details, gRPC's or Triton's own text, are for the log."""
    code = exc.code()
    detail = f"gRPC {code.name}: {exc.details()}"
    answered = f"it answered gRPC status {code.name}."
    if code is grpc.StatusCode.UNAVAILABLE:
        return ReplicaUnavailable(CONNECTION_LOST, detail)
    if code in _UNAVAILABLE:
        return ReplicaUnavailable(answered, detail)
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return UpstreamTimeout(TIMED_OUT, detail)
    if code is grpc.StatusCode.INVALID_ARGUMENT:  # as an HTTP 400: a plain reason is told
        return UpstreamRejected(plain_reason(exc.details() or "") or answered, detail=detail)
    return UpstreamError(answered, detail)
