"""`/admin/batches`: every tenant's batches for operators (a tenant's own admin: its
tenant's), with their progress; and cancel. `gateway batches` calls these."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from gateway.api.batch_apis.batch_service import service_of
from gateway.api.batch_apis.files_api import int_param, json_response
from gateway.api.batch_apis.openai_batches import not_cancellable
from gateway.api.endpoints import admin_identity, runtime_of, scoped_tenant
from gateway.api.errors import APIError
from gateway.batches.batch_records import BatchRecord
from gateway.batches.batch_store import NotCancellable
from gateway.serving.auth import Identity


def admin_batch(batch: BatchRecord) -> dict[str, object]:
    """A batch as operators see it: whose, which API, where its lines are."""
    counts, tokens = batch.counts, batch.tokens
    return {
        "id": batch.id,
        "api": batch.api.value,
        "tenant": batch.tenant,
        "key_id": batch.key_id,
        "endpoint": batch.endpoint,
        "models": list(batch.models),
        "status": batch.status.value,
        "created_at": batch.created_at,
        "expires_at": batch.expires_at,
        "lines": {
            "total": counts.total,
            "done": counts.done,
            "failed": counts.failed,
            "cancelled": counts.cancelled,
            "expired": counts.expired,
            "left": counts.total - counts.finished,
        },
        "tokens": {
            "input": tokens.input_tokens,
            "cached": tokens.cached_tokens,
            "output": tokens.output_tokens,
        },
        "stopped_by": batch.stopped_by,
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
    }


async def list_batches(request: Request) -> Response:
    """`GET /admin/batches[?tenant=NAME&limit=N&after=ID]`: newest first."""
    admin = await admin_identity(request, scoped=True)
    params = request.query_params
    tenant = scoped_tenant(admin, params.get("tenant"), runtime_of(request).config.tenants.tenants)
    limit = int_param(params.get("limit"), 100, 1, 1000, "limit")
    batches, more = await service_of(request).store.batches(
        tenant, None, after=params.get("after"), limit=limit
    )
    return json_response(
        {"object": "list", "data": [admin_batch(b) for b in batches], "has_more": more}, {}
    )


async def get_batch(request: Request) -> Response:
    """`GET /admin/batches/{id}`."""
    admin = await admin_identity(request, scoped=True)
    return json_response(admin_batch(await _batch(request, admin)), {})


async def cancel_batch(request: Request) -> Response:
    """`POST /admin/batches/{id}/cancel`: as its tenant's cancel."""
    admin = await admin_identity(request, scoped=True)
    batch = await _batch(request, admin)
    service = service_of(request)
    try:
        await service.cancel(batch)
    except NotCancellable as ended:
        raise not_cancellable(ended) from None
    return json_response(admin_batch(await _batch(request, admin)), {})


async def _batch(request: Request, admin: Identity) -> BatchRecord:
    batch_id = request.path_params["batch_id"]
    batch = await service_of(request).store.find(batch_id)
    scope = admin.admin_scope
    if batch is None or (scope != "*" and batch.tenant != scope):
        raise APIError(404, f"No batch found with id '{batch_id[:128]}'.", code="batch_not_found")
    return batch
