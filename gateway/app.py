"""Build the Starlette app from a Config. Wiring only: every behaviour lives elsewhere."""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Lifespan

from gateway.api import admin_keys, admin_mcp, endpoints, exchange, mcp_endpoint
from gateway.api.anthropic import count_tokens
from gateway.api.batch_apis import admin_batches, anthropic_batches, files_api, openai_batches
from gateway.api.batch_apis.batch_service import BatchService
from gateway.api.errors import CLIENT_ERRORS, DOMAIN_ERRORS, APIError, client_error
from gateway.api.responses import responses_state
from gateway.config import Config, load_config
from gateway.config.schema import OpsOnApiPort
from gateway.inference import schemas
from gateway.inference.schemas import SchemaLimits
from gateway.observability import metrics, trace_settings, tracing
from gateway.observability.logging import configure_logging
from gateway.serving.conductor import Conductor
from gateway.serving.gateway_state import GatewayState
from gateway.serving.reload import TenantsReloader
from gateway.serving.runtime import Runtime
from gateway.transport import protocol
from gateway.transport.direct import DirectRoutes
from gateway.transport.listeners import Listeners
from gateway.transport.streaming import CUT_STREAM_LOG_FILTER

log = logging.getLogger("gateway")

CONFIG_ENV = "GATEWAY_CONFIG"


def build_app(config: Config) -> ASGIApp:
    """The gateway's ASGI app for `config`: Starlette, with the completion endpoints
    served directly (see `gateway.transport.direct`), and the ops listener's routes apart when
    `server.ops.port` is set (see `gateway.transport.listeners`)."""
    protocol.configure(config.gateway.server)
    logging.getLogger("uvicorn.error").addFilter(CUT_STREAM_LOG_FILTER)
    caps = config.gateway.server.json_schema
    schemas.configure(SchemaLimits(caps.max_bytes, caps.max_depth, caps.max_properties))
    traced = trace_settings.settings(
        config.gateway.tracing.model_dump(exclude_none=True), os.environ
    )
    runtime = Runtime.build(config)
    conductor = Conductor(runtime)
    batches = BatchService.build(runtime, conductor)
    mcp = mcp_endpoint.McpGateway.build(runtime)
    reloader = TenantsReloader(runtime)
    metrics.watch_state(GatewayState(runtime.admission, runtime.routes.values()))
    metrics.set_config_version(runtime.config_version)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if traced is not None:
            tracing.start(traced)  # per process: its export thread is this worker's
        await runtime.start()
        reloader.start()
        if batches is not None:
            batches.start()
        mcp.start()
        # What exists now lives as long as the process: the collector need not scan it
        # again on every full collection (CPython's gc.freeze, meant for this).
        gc.freeze()
        log.info("gateway ready: models %s", ", ".join(runtime.routes))
        try:
            yield
        finally:
            await mcp.close()
            if batches is not None:
                await batches.close()
            await reloader.stop()
            await runtime.close()
            tracing.stop()

    hot_routes = {
        "/v1/chat/completions": exchange.chat_completions,
        "/v1/completions": exchange.completions,
        "/v1/embeddings": exchange.embeddings,
        "/v1/messages": exchange.messages,
        "/v1/responses": exchange.responses,
    }
    probes = [
        Route("/livez", endpoints.livez, methods=["GET"]),
        Route("/healthz", endpoints.livez, methods=["GET"]),
        Route("/readyz", endpoints.readyz, methods=["GET"]),
    ]
    api_routes = [Route(path, endpoint, methods=["POST"]) for path, endpoint in hot_routes.items()]
    api_routes += [
        Route("/v1/messages/count_tokens", count_tokens.count_tokens, methods=["POST"]),
        Route("/v1/responses/{response_id}", responses_state.retrieve, methods=["GET"]),
        Route("/v1/responses/{response_id}", responses_state.delete, methods=["DELETE"]),
        Route("/v1/models", endpoints.list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", endpoints.retrieve_model, methods=["GET"]),
        Route("/openapi.json", endpoints.openapi_json, methods=["GET"]),
        Route("/mcp", mcp_endpoint.post, methods=["POST"]),
        Route("/mcp", mcp_endpoint.get, methods=["GET"]),
        Route("/mcp", mcp_endpoint.delete, methods=["DELETE"]),
        *probes,
    ]
    if batches is not None:
        api_routes += _batch_routes()
    ops = config.gateway.server.ops
    if ops.on_api_port is OpsOnApiPort.ADMIN_KEY:
        api_routes += [
            Route("/admin/reload", endpoints.reload_tenants, methods=["POST"]),
            Route("/admin/usage", endpoints.usage_report, methods=["GET"]),
            Route("/admin/usage/requests", endpoints.usage_requests, methods=["GET"]),
            *_key_routes(),
            *_admin_batch_routes(batches),
            Route("/metrics", endpoints.metrics_for_admins, methods=["GET"]),
        ]
    api = DirectRoutes(_starlette(api_routes, lifespan), hot_routes, on_error=_error)
    api.app.state.runtime, api.app.state.reloader = runtime, reloader
    api.app.state.conductor, api.app.state.batches = conductor, batches
    api.app.state.mcp = mcp
    if ops.port is None:
        return api
    ops_routes = [
        Route("/metrics", endpoints.metrics_endpoint, methods=["GET"]),
        Route("/admin/reload", endpoints.reload_tenants, methods=["POST"]),
        Route("/admin/usage", endpoints.usage_report, methods=["GET"]),
        Route("/admin/usage/requests", endpoints.usage_requests, methods=["GET"]),
        *_key_routes(),
        *_admin_batch_routes(batches),
        *probes,
    ]
    ops_app = _starlette(ops_routes)
    ops_app.state.runtime, ops_app.state.reloader = runtime, reloader
    ops_app.state.batches, ops_app.state.mcp = batches, mcp
    return Listeners(api, ops_app, ops.port)


def _batch_routes() -> list[Route]:
    """The Batch APIs: OpenAI's files and batches, Anthropic's message batches."""
    return [
        Route("/v1/files", files_api.upload, methods=["POST"]),
        Route("/v1/files", files_api.list_files, methods=["GET"]),
        Route("/v1/files/{file_id}", files_api.retrieve, methods=["GET"]),
        Route("/v1/files/{file_id}", files_api.delete, methods=["DELETE"]),
        Route("/v1/files/{file_id}/content", files_api.content, methods=["GET"]),
        Route("/v1/batches", openai_batches.create, methods=["POST"]),
        Route("/v1/batches", openai_batches.list_batches, methods=["GET"]),
        Route("/v1/batches/{batch_id}", openai_batches.retrieve, methods=["GET"]),
        Route("/v1/batches/{batch_id}/cancel", openai_batches.cancel, methods=["POST"]),
        Route("/v1/messages/batches", anthropic_batches.create, methods=["POST"]),
        Route("/v1/messages/batches", anthropic_batches.list_batches, methods=["GET"]),
        Route("/v1/messages/batches/{batch_id}", anthropic_batches.retrieve, methods=["GET"]),
        Route("/v1/messages/batches/{batch_id}", anthropic_batches.delete, methods=["DELETE"]),
        Route("/v1/messages/batches/{batch_id}/cancel", anthropic_batches.cancel, methods=["POST"]),
        Route(
            "/v1/messages/batches/{batch_id}/results", anthropic_batches.results, methods=["GET"]
        ),
    ]


def _admin_batch_routes(batches: BatchService | None) -> list[Route]:
    """`/admin/batches`: every tenant's batches for operators (`gateway batches`)."""
    if batches is None:
        return []
    return [
        Route("/admin/batches", admin_batches.list_batches, methods=["GET"]),
        Route("/admin/batches/{batch_id}", admin_batches.get_batch, methods=["GET"]),
        Route("/admin/batches/{batch_id}/cancel", admin_batches.cancel_batch, methods=["POST"]),
    ]


def _key_routes() -> list[Route]:
    """`/admin/keys`: the managed API keys (`gateway.api.admin_keys`); and a stored
    response of any of a tenant's keys, read or deleted (`responses_state.admin_retrieve`,
    `admin_delete`)."""
    return [
        Route("/admin/responses/{response_id}", responses_state.admin_retrieve, methods=["GET"]),
        Route("/admin/responses/{response_id}", responses_state.admin_delete, methods=["DELETE"]),
        Route("/admin/keys", admin_keys.create_key, methods=["POST"]),
        Route("/admin/keys", admin_keys.list_keys, methods=["GET"]),
        Route("/admin/keys/{key_id}", admin_keys.get_key, methods=["GET"]),
        Route("/admin/keys/{key_id}", admin_keys.update_key, methods=["PATCH"]),
        Route("/admin/keys/{key_id}", admin_keys.revoke_key, methods=["DELETE"]),
        Route("/admin/keys/{key_id}/rotate", admin_keys.rotate_key, methods=["POST"]),
        Route("/admin/mcp/tools", admin_mcp.held_tools, methods=["GET"]),
        Route("/admin/mcp/tools/accept", admin_mcp.accept_tool, methods=["POST"]),
    ]


def _starlette(routes: list[Route], lifespan: Lifespan[Starlette] | None = None) -> Starlette:
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            APIError: _api_error,
            **{error: _api_error for error in DOMAIN_ERRORS},
            HTTPException: _http_error,
            Exception: _unexpected_error,
        },
    )
    # No redirect to the path with or without its trailing slash: Starlette builds its
    # Location from the client's Host header. Such a path is a 404 like any unknown one.
    app.router.redirect_slashes = False
    return app


def app_from_env() -> ASGIApp:
    """Factory for uvicorn workers: the config path comes from `GATEWAY_CONFIG`."""
    configure_logging()
    return build_app(load_config(os.environ[CONFIG_ENV]))


async def _error(request: Request, exc: Exception) -> Response:
    """The response for an exception of a directly served endpoint."""
    if isinstance(exc, CLIENT_ERRORS):
        return await _api_error(request, exc)
    return await _unexpected_error(request, exc)


async def _api_error(request: Request, exc: Exception) -> Response:
    error = client_error(exc)
    if error.status >= 500:
        log.warning("%s %s -> %d %s", request.method, request.url.path, error.status, error.message)
    return error.response()


async def _http_error(request: Request, exc: Exception) -> Response:
    # Unknown paths and wrong methods get the same error shape as everything else, with
    # a message that names what was not found (as OpenAI's "Invalid URL (GET /v1/x)").
    assert isinstance(exc, HTTPException)
    where = f"{request.method} {request.url.path}"
    messages = {404: f"Invalid URL ({where}).", 405: f"Method not allowed ({where})."}
    message = messages.get(exc.status_code, str(exc.detail))
    codes = {404: "unknown_url", 405: "method_not_allowed"}
    return APIError(
        exc.status_code, message, code=codes.get(exc.status_code), headers=dict(exc.headers or {})
    ).response()


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return APIError(
        500, "The gateway failed to handle the request.", type="server_error"
    ).response()
