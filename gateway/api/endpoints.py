"""The HTTP handlers: `/v1/chat/completions`, `/v1/completions`, `/v1/models`, health."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from gateway.api import errors
from gateway.api.errors import APIError
from gateway.api.requests import decode_json, parse_chat, parse_completion, requested_model
from gateway.api.responses import SSE_DONE, ChunkWriter, completion_body, new_id, sse_error
from gateway.auth import Identity
from gateway.backends.base import UpstreamError, UpstreamRejected, UpstreamTimeout
from gateway.inference import Delta, InferenceRequest, UpstreamCall, UsageMeter
from gateway.resilience import failover
from gateway.resilience.failover import NoReplicaLeft
from gateway.routes import ModelRoute
from gateway.runtime import Runtime
from gateway.tokens import estimate_tokens

Parser = Callable[[Mapping[str, Any], int], InferenceRequest]

access_log = logging.getLogger("gateway.access")

_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def _runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing more than `limit` bytes before reading them all."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise errors.body_too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise errors.body_too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


async def chat_completions(request: Request) -> Response:
    return await _serve(request, parse_chat)


async def completions(request: Request) -> Response:
    return await _serve(request, parse_completion)


async def list_models(request: Request) -> Response:
    runtime = _runtime(request)
    identity = runtime.auth.identify(request.headers.get("authorization"))
    data = [
        {"id": name, "object": "model", "created": 0, "owned_by": "gateway"}
        for name in runtime.routes
        if identity.may_use(name)
    ]
    return Response(orjson.dumps({"object": "list", "data": data}), media_type="application/json")


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    """Ready when Redis answers and every model has a healthy replica."""
    runtime = _runtime(request)
    redis_ok = await runtime.redis_ok()
    models = {name: route.pool.ready for name, route in runtime.routes.items()}
    ready = redis_ok and all(models.values())
    return JSONResponse(
        {"ready": ready, "redis": redis_ok, "models": models},
        status_code=200 if ready else 503,
    )


async def _serve(request: Request, parse: Parser) -> Response:
    started = time.perf_counter()
    runtime = _runtime(request)
    identity = runtime.auth.identify(request.headers.get("authorization"))
    body = await read_body(request, runtime.config.gateway.server.max_body_bytes)
    data = decode_json(body)
    route = _route(runtime, identity, requested_model(data))
    inference = parse(data, route.config.max_tokens_default)
    if inference.params.max_tokens > route.config.max_tokens_limit:
        raise errors.bad_request(
            f"`max_tokens` may be at most {route.config.max_tokens_limit} for `{route.name}`.",
            "max_tokens",
        )
    call = route.upstream_call(inference)
    response_id = new_id(inference.kind)
    if inference.stream:
        return await _stream(route, inference, call, response_id, identity, started)
    try:
        completion = await failover.complete(route, call)
    except (UpstreamError, NoReplicaLeft) as exc:
        raise upstream_api_error(route.name, exc) from exc
    if completion.usage.prompt_tokens == 0:
        completion.usage.prompt_tokens = estimate_tokens(call.prompt)
    _log(identity, route, 200, started, completion.usage.total_tokens)
    return Response(
        completion_body(inference, completion, response_id=response_id, model=route.name),
        media_type="application/json",
    )


def _route(runtime: Runtime, identity: Identity, model: str) -> ModelRoute:
    route = runtime.routes.get(model)
    if route is None:
        raise errors.model_not_found(model)
    if not identity.may_use(model):
        raise errors.model_not_allowed(model)
    return route


async def _stream(
    route: ModelRoute,
    inference: InferenceRequest,
    call: UpstreamCall,
    response_id: str,
    identity: Identity,
    started: float,
) -> Response:
    deltas = failover.stream(route, call)
    # Wait for the first piece before answering, so that a failure up to here is a
    # plain HTTP error (and another replica could still be tried).
    try:
        first: Delta | None = await anext(deltas)
    except StopAsyncIteration:
        first = None
    except (UpstreamError, NoReplicaLeft) as exc:
        await deltas.aclose()
        raise upstream_api_error(route.name, exc) from exc
    events = _sse_events(route, inference, call, first, deltas, response_id, identity, started)
    return StreamingResponse(events, media_type="text/event-stream", headers=_SSE_HEADERS)


async def _sse_events(
    route: ModelRoute,
    inference: InferenceRequest,
    call: UpstreamCall,
    first: Delta | None,
    deltas: AsyncGenerator[Delta, None],
    response_id: str,
    identity: Identity,
    started: float,
) -> AsyncIterator[bytes]:
    writer = ChunkWriter(inference, response_id=response_id, model=route.name)
    meter = UsageMeter()
    status = 200
    try:
        if first is not None:
            meter.add(first)
            if first.text:
                yield writer.text(first.text)
            async for delta in deltas:
                meter.add(delta)
                if delta.text:
                    yield writer.text(delta.text)
        usage = meter.usage(estimate_tokens(call.prompt))
        yield writer.finish(meter.finish_reason or call.finish_reason(usage.completion_tokens))
        if inference.include_usage:
            yield writer.usage(usage)
        yield SSE_DONE
    except (UpstreamError, NoReplicaLeft) as exc:
        # Headers are gone: the failure becomes a terminal error event.
        api_error = upstream_api_error(route.name, exc)
        status = api_error.status
        yield sse_error(api_error.body())
    finally:
        await deltas.aclose()
        _log(identity, route, status, started, meter.completion_tokens)


def upstream_api_error(model: str, exc: Exception) -> APIError:
    """What the client is told when the upstream failed."""
    if isinstance(exc, NoReplicaLeft):
        return errors.no_replica(model)
    if isinstance(exc, UpstreamTimeout):
        return errors.upstream_timeout(model)
    if isinstance(exc, UpstreamRejected) and 400 <= exc.status < 500:
        return errors.bad_request(f"The backend for `{model}` refused the request: {exc}")
    return errors.upstream_failed(model, str(exc))


def _log(identity: Identity, route: ModelRoute, status: int, started: float, tokens: int) -> None:
    if access_log.isEnabledFor(logging.INFO):
        access_log.info(
            "tenant=%s model=%s status=%d tokens=%d ms=%.1f",
            identity.name,
            route.name,
            status,
            tokens,
            (time.perf_counter() - started) * 1000,
        )
