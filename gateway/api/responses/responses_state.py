"""The Responses API's state: `previous_response_id` continues a stored conversation,
`store` keeps an answer (`gateway.storage.response_store`), and `GET` / `DELETE
/v1/responses/{id}` read and forget one. Every response is the API key's that made it
(issue 40): an id of another tenant's response, or of another key's of the same
tenant, is not found. `GET /admin/responses/{id}?tenant=` reads any response of a
tenant, with its owner, for the tenant's admin."""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson
from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.responses import Response

from gateway.api import errors
from gateway.api.body import Parser
from gateway.api.counted import CountRequest, serve_counted
from gateway.api.endpoints import admin_identity, runtime_of, scoped_tenant
from gateway.api.errors import APIError
from gateway.api.responses.responses_answers import conversation_after, state_of
from gateway.api.responses.responses_requests import parse_responses
from gateway.inference.types import ChatMessage, InferenceRequest, ToolCall
from gateway.observability import metrics
from gateway.observability.access import RequestRecord
from gateway.serving.auth import Identity, owner_of
from gateway.storage.response_store import StoreFull, StoreQuota

if TYPE_CHECKING:
    from gateway.serving.runtime import Runtime

log = logging.getLogger("gateway")


def not_found(response_id: str, param: str | None = None) -> APIError:
    return APIError(
        404,
        f"Response with id '{response_id}' not found.",
        param=param,
        code="response_not_found",
    )


async def prepare(
    runtime: Runtime, identity: Identity, data: Mapping[str, Any], body_bytes: int
) -> Parser:
    """The parser of a request: one that continues the previous response's conversation
    when `previous_response_id` names one (a 404 when it is unknown, expired or another
    tenant's; a 503 when Redis cannot tell). A request that would store its answer is
    refused first (429) when its tenant's stored responses have no room left for it: for
    a record of at least its body and the conversation it continues (`body_bytes`, and
    the previous record's size)."""
    store = data.get("store") is not False
    previous = data.get("previous_response_id")
    if previous is None:
        if store:
            await _room(runtime, identity, body_bytes)
        return parse_responses
    if not isinstance(previous, str) or not previous:
        raise APIError(
            400, "`previous_response_id` must be a string.", param="previous_response_id"
        )
    try:
        stored = await runtime.responses.load(identity.name, previous, owner_of(identity))
    except RedisError as exc:
        raise _unavailable() from exc
    if stored is None:
        raise not_found(previous, "previous_response_id")
    if store:
        await _room(runtime, identity, body_bytes + stored.size)
    history = tuple(_message(m) for m in stored.record["messages"])
    # The conversation's first response names its session, unless the client did.
    session = stored.record.get("session") or previous
    return functools.partial(parse_responses, history=history, session=session)


def quota_of(identity: Identity) -> StoreQuota:
    """The caller's tenant's quota on stored responses (tenants.yaml)."""
    settings = identity.tenant.stored_responses
    return StoreQuota(settings.max_bytes, settings.max_count)


async def _room(runtime: Runtime, identity: Identity, need: int) -> None:
    """A 429 naming the quota if the tenant's stored responses have no room for one more
    of `need` bytes. Redis down: the request runs, and its answer is not stored (as
    `keep` does)."""
    quota = quota_of(identity)
    try:
        usage = await runtime.responses.room(identity.name, quota, need)
    except StoreFull as full:
        metrics.stored_responses(full.tenant, full.usage, full.limits)
        raise errors.client_error(full) from None
    except RedisError:
        return
    metrics.stored_responses(identity.name, usage, quota)


# The header of an answer that was not stored (its tenant's quota had no room for it).
NOT_STORED_HEADER = "x-gateway-not-stored"


async def keep(
    runtime: Runtime, identity: Identity, request: InferenceRequest, answer: dict[str, Any] | bytes
) -> dict[str, str]:
    """Store a whole answer and its conversation, when the request says `store`. A
    response that cannot be stored (Redis down, or its tenant's quota has no room left
    for it) is still answered, and logged; the headers the answer gets then say why."""
    if not state_of(request).store:
        return {}
    response = orjson.loads(answer) if isinstance(answer, bytes) else answer
    messages = [_record(m) for m in conversation_after(request, response)]
    tenant, quota = identity.name, quota_of(identity)
    try:
        usage = await runtime.responses.save(
            tenant, owner_of(identity), response, messages, quota, request.session
        )
    except StoreFull as full:
        metrics.stored_responses(tenant, full.usage, full.limits, refused=full.quota)
        log.warning(
            "response %s not stored: tenant %s at stored_responses.%s (%d of %d)",
            response["id"], tenant, full.quota, full.used, full.limit,
        )  # fmt: skip
        return {NOT_STORED_HEADER: f"stored_responses.{full.quota}"}
    except RedisError as exc:
        log.warning("response %s not stored: %s", response["id"], exc)
        return {NOT_STORED_HEADER: "unavailable"}
    metrics.stored_responses(tenant, usage, quota)
    return {}


async def retrieve(request: Request) -> Response:
    """`GET /v1/responses/{id}`: a stored response of the caller's tenant."""
    return await serve_counted(request, "responses_retrieve", _retrieve)


async def delete(request: Request) -> Response:
    """`DELETE /v1/responses/{id}`: forget a stored response of the caller's tenant."""
    return await serve_counted(request, "responses_delete", _delete)


async def _retrieve(
    request: Request, identity: Identity, record: RequestRecord, count: CountRequest
) -> Response:
    limits = await count("")
    response_id = request.path_params["response_id"]
    try:
        stored = await runtime_of(request).responses.load(
            identity.name, response_id, owner_of(identity)
        )
    except RedisError as exc:
        raise _with(limits, _unavailable()) from exc
    if stored is None:
        raise _with(limits, not_found(response_id))
    body = orjson.dumps(stored.record["response"])
    return Response(body, media_type="application/json", headers=limits)


async def _delete(
    request: Request, identity: Identity, record: RequestRecord, count: CountRequest
) -> Response:
    limits = await count("")
    response_id = request.path_params["response_id"]
    try:
        deleted = await runtime_of(request).responses.delete(
            identity.name, response_id, owner_of(identity)
        )
    except RedisError as exc:
        raise _with(limits, _unavailable()) from exc
    if not deleted:
        raise _with(limits, not_found(response_id))
    body = {"id": response_id, "object": "response", "deleted": True}
    return Response(orjson.dumps(body), media_type="application/json", headers=limits)


async def admin_retrieve(request: Request) -> Response:
    """`GET /admin/responses/{id}?tenant=NAME`: a stored response of the tenant, whichever
    of its keys made it (and those stored before owners were kept), with its owner's key
    id, for a global admin (who names the tenant) or the tenant's own admin."""
    runtime, tenant = await _admin_tenant(request)
    response_id = request.path_params["response_id"]
    try:
        stored = await runtime.responses.load(tenant, response_id, None)
    except RedisError as exc:
        raise _unavailable() from exc
    if stored is None:
        raise not_found(response_id)
    body = {
        "object": "stored_response",
        "id": response_id,
        "tenant": tenant,
        "owner": stored.owner,
        "response": stored.record["response"],
    }
    return Response(orjson.dumps(body), media_type="application/json")


async def admin_delete(request: Request) -> Response:
    """`DELETE /admin/responses/{id}?tenant=NAME`: delete a stored response of the tenant,
    whichever of its keys made it, giving its room in the tenant's quota back: the way
    out when one key has filled what all the tenant's keys share (a key cannot delete
    another's). For a global admin (who names the tenant) or the tenant's own admin."""
    runtime, tenant = await _admin_tenant(request)
    response_id = request.path_params["response_id"]
    try:
        deleted = await runtime.responses.delete(tenant, response_id, None)
    except RedisError as exc:
        raise _unavailable() from exc
    if not deleted:
        raise not_found(response_id)
    log.warning("stored response %s of tenant %s deleted by an admin", response_id, tenant)
    body = {"id": response_id, "object": "response", "deleted": True}
    return Response(orjson.dumps(body), media_type="application/json")


async def _admin_tenant(request: Request) -> tuple[Runtime, str]:
    """The gateway, and the tenant an admin's stored-response request is about (401, 403
    or 404 otherwise; a global admin must name it)."""
    admin = await admin_identity(request, scoped=True)
    runtime = runtime_of(request)
    tenant = scoped_tenant(
        admin, request.query_params.get("tenant"), runtime.config.tenants.tenants
    )
    if tenant is None:  # a global admin that named none: stored responses are by tenant
        raise APIError(
            400,
            "Name the tenant whose stored response this is: `?tenant=NAME`.",
            param="tenant",
            code="missing_tenant",
        )
    return runtime, tenant


def _with(limits: dict[str, str], error: APIError) -> APIError:
    error.headers.update(limits)
    return error


def _unavailable() -> APIError:
    return APIError(
        503,
        "Stored responses cannot be reached right now.",
        type="server_error",
        retry_after_s=1.0,
    )


def _record(message: ChatMessage) -> dict[str, Any]:
    """A message as a stored conversation keeps it."""
    record: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        record["tool_calls"] = [[c.id, c.name, c.arguments] for c in message.tool_calls]
    if message.tool_call_id is not None:
        record["tool_call_id"] = message.tool_call_id
    return record


def _message(record: dict[str, Any]) -> ChatMessage:
    calls = tuple(ToolCall(*call) for call in record.get("tool_calls", ()))
    return ChatMessage(record["role"], record["content"], calls, record.get("tool_call_id"))
