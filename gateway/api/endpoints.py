"""The HTTP handlers: `/v1/chat/completions`, `/v1/completions`, `/v1/models`, health."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from gateway.api import errors
from gateway.api.errors import APIError, rate_limited
from gateway.api.requests import decode_json, parse_chat, parse_completion, requested_model
from gateway.api.responses import SSE_DONE, ChunkWriter, completion_body, new_id, sse_error
from gateway.auth import Identity
from gateway.backends.base import UpstreamError, UpstreamRejected, UpstreamTimeout
from gateway.inference import Delta, InferenceRequest, UpstreamCall, UsageMeter
from gateway.observability import metrics
from gateway.ratelimit.limiter import Decision
from gateway.reload import TenantsReloader
from gateway.resilience import failover
from gateway.resilience.failover import NoReplicaLeft
from gateway.routes import ModelRoute
from gateway.runtime import Runtime
from gateway.tokens import estimate_tokens

Parser = Callable[[Mapping[str, Any], int], InferenceRequest]

access_log = logging.getLogger("gateway.access")

_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}

# A concurrency lease outlives the longest request by this much before it expires on
# its own (which only matters when a gateway dies holding it).
LEASE_MARGIN_S = 10.0


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


async def reload_tenants(request: Request) -> Response:
    """`POST /admin/reload`: reload the tenants file now (admin tenants only)."""
    runtime = _runtime(request)
    identity = runtime.auth.identify(request.headers.get("authorization"))
    if not identity.tenant.admin:
        raise APIError(
            403, "This key may not use the admin API.", type="permission_error", code="not_admin"
        )
    reloader: TenantsReloader = request.app.state.reloader
    result = await reloader.reload(f"admin API by {identity.name}")
    if not result.applied:
        error = APIError(
            400,
            "The tenants file was refused; the running tenants stay: " + "; ".join(result.problems),
            code="invalid_config",
        )
        return JSONResponse({**error.body(), "problems": result.problems}, status_code=400)
    return JSONResponse({"applied": True, "changes": result.changes})


async def metrics_endpoint(request: Request) -> Response:
    return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)


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


@dataclass(slots=True)
class _Exchange:
    """One admitted request on its way through the gateway."""

    runtime: Runtime
    identity: Identity
    route: ModelRoute
    request: InferenceRequest
    call: UpstreamCall
    decision: Decision
    started: float
    prompt_estimate: int
    response_id: str = field(init=False)

    def __post_init__(self) -> None:
        self.response_id = new_id(self.request.kind)

    def charge(self, used_tokens: int) -> None:
        if self.decision.ticket is not None:
            self.runtime.limiter.charge(self.decision.ticket, used_tokens)

    def settle(self, used_tokens: int) -> None:
        if self.decision.ticket is not None:
            self.runtime.limiter.settle(self.decision.ticket, used_tokens)

    def log(self, status: int, tokens: int) -> None:
        if access_log.isEnabledFor(logging.INFO):
            access_log.info(
                "tenant=%s model=%s status=%d tokens=%d ms=%.1f",
                self.identity.name,
                self.route.name,
                status,
                tokens,
                (time.perf_counter() - self.started) * 1000,
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
    prompt_estimate = estimate_tokens(call.prompt)
    decision = await runtime.limiter.admit(
        identity.name,
        route.name,
        prompt_estimate + _completion_reserve(runtime, inference),
        lease_ttl_s=route.config.timeouts.total_s + LEASE_MARGIN_S,
    )
    if not decision.allowed:
        raise rate_limited(decision)
    exchange = _Exchange(
        runtime, identity, route, inference, call, decision, started, prompt_estimate
    )
    if inference.stream:
        return await _stream(exchange)
    return await _complete(exchange)


def _completion_reserve(runtime: Runtime, inference: InferenceRequest) -> int:
    """Completion tokens to reserve: the client's max_tokens, else a configured estimate."""
    if inference.requested_max_tokens is not None:
        return inference.requested_max_tokens
    estimate = runtime.config.gateway.ratelimit.completion_tokens_estimate
    return min(inference.params.max_tokens, estimate)


def _route(runtime: Runtime, identity: Identity, model: str) -> ModelRoute:
    route = runtime.routes.get(model)
    if route is None:
        raise errors.model_not_found(model)
    if not identity.may_use(model):
        raise errors.model_not_allowed(model)
    return route


async def _complete(exchange: _Exchange) -> Response:
    used = 0
    try:
        completion = await failover.complete(exchange.route, exchange.call)
        if completion.usage.prompt_tokens == 0:
            completion.usage.prompt_tokens = exchange.prompt_estimate
        used = completion.usage.total_tokens
    except (UpstreamError, NoReplicaLeft) as exc:
        raise upstream_api_error(exchange.route.name, exc) from exc
    finally:
        exchange.settle(used)
    exchange.log(200, used)
    body = completion_body(
        exchange.request,
        completion,
        response_id=exchange.response_id,
        model=exchange.route.name,
    )
    return Response(body, media_type="application/json", headers=exchange.decision.headers)


async def _stream(exchange: _Exchange) -> Response:
    deltas = failover.stream(exchange.route, exchange.call)
    # Wait for the first piece before answering, so that a failure up to here is a
    # plain HTTP error (and another replica could still be tried).
    try:
        first: Delta | None = await anext(deltas)
    except StopAsyncIteration:
        first = None
    except (UpstreamError, NoReplicaLeft) as exc:
        await deltas.aclose()
        exchange.settle(0)
        raise upstream_api_error(exchange.route.name, exc) from exc
    headers = {**_SSE_HEADERS, **exchange.decision.headers}
    return StreamingResponse(
        _sse_events(exchange, first, deltas), media_type="text/event-stream", headers=headers
    )


async def _sse_events(
    exchange: _Exchange, first: Delta | None, deltas: AsyncGenerator[Delta, None]
) -> AsyncIterator[bytes]:
    writer = ChunkWriter(
        exchange.request, response_id=exchange.response_id, model=exchange.route.name
    )
    meter = UsageMeter()
    status = 200
    charging = exchange.decision.ticket is not None
    try:
        if first is not None:
            meter.add(first)
            if first.text:
                yield writer.text(first.text)
            async for delta in deltas:
                meter.add(delta)
                if charging:
                    exchange.charge(meter.usage(exchange.prompt_estimate).total_tokens)
                if delta.text:
                    yield writer.text(delta.text)
        usage = meter.usage(exchange.prompt_estimate)
        finish = meter.finish_reason or exchange.call.finish_reason(usage.completion_tokens)
        yield writer.finish(finish)
        if exchange.request.include_usage:
            yield writer.usage(usage)
        yield SSE_DONE
    except (UpstreamError, NoReplicaLeft) as exc:
        # Headers are gone: the failure becomes a terminal error event.
        api_error = upstream_api_error(exchange.route.name, exc)
        status = api_error.status
        yield sse_error(api_error.body())
    finally:
        await deltas.aclose()
        used = meter.usage(exchange.prompt_estimate).total_tokens
        exchange.settle(used)
        exchange.log(status, used)


def upstream_api_error(model: str, exc: Exception) -> APIError:
    """What the client is told when the upstream failed."""
    if isinstance(exc, NoReplicaLeft):
        return errors.no_replica(model)
    if isinstance(exc, UpstreamTimeout):
        return errors.upstream_timeout(model)
    if isinstance(exc, UpstreamRejected) and 400 <= exc.status < 500:
        return errors.bad_request(f"The backend for `{model}` refused the request: {exc}")
    return errors.upstream_failed(model, str(exc))
