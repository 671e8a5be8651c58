"""Anthropic's `POST /v1/messages/count_tokens`: the prompt tokens a message request would
count, counted against the request limit itself."""

from __future__ import annotations

import orjson
from starlette.requests import Request
from starlette.responses import Response

from gateway.api.anthropic.anthropic_answers import credentials, error_response, ratelimit_headers
from gateway.api.anthropic.anthropic_requests import parse_count_tokens
from gateway.api.body import decode_json, requested_model
from gateway.api.counted import CountRequest, serve_counted
from gateway.api.endpoints import conductor_of, runtime_of
from gateway.api.errors import APIError
from gateway.api.exchange import read_body
from gateway.observability.access import RequestRecord
from gateway.serving.auth import Identity
from gateway.serving.conductor import upstream_call


async def count_tokens(request: Request) -> Response:
    """The prompt tokens a message request would count (the gateway's estimate of the
    prompt its model's template renders): counted against the request limit, not queued,
    and no tokens charged."""
    return await serve_counted(
        request, "count_tokens", _count_tokens, credentials, render_error=error_response
    )


async def _count_tokens(
    request: Request, identity: Identity, record: RequestRecord, count: CountRequest
) -> Response:
    runtime, conductor = runtime_of(request), conductor_of(request)
    body = await read_body(request, runtime.config.gateway.server.max_body_bytes)
    data = decode_json(body)
    route = conductor.authorize(identity, requested_model(data), record)
    limits = await count(route.name)
    try:
        inference = parse_count_tokens(data, route.config.max_tokens_default)
        # Counted from the prompt the model's template renders, as a request is.
        tokens = (await upstream_call(route, inference, len(body))).prompt_estimate
    except APIError as exc:
        exc.headers.update(limits)
        raise
    headers = {**limits, **ratelimit_headers(limits)}
    answer = orjson.dumps({"input_tokens": tokens})
    return Response(answer, media_type="application/json", headers=headers)
