"""The HTTP handlers besides completions: `/v1/models`, admin, metrics, health.

`/admin/*` needs an admin tenant's key wherever it is served (the log names who acted).
`/metrics` is open on the ops listener and needs an admin key on the API port.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Collection

import orjson
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS_TYPE
from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.api.errors import APIError, model_not_found
from gateway.api.openapi import openapi_document
from gateway.config import ModelConfig
from gateway.ledger.ledger_store import LedgerStore
from gateway.ledger.usage_records import COLUMNS
from gateway.ledger.usage_report import (
    ReportQuery,
    parse_group_by,
    point_in_time,
    render_csv,
    report_columns,
)
from gateway.ledger.usage_requests import RequestsQuery
from gateway.observability import metrics
from gateway.serving.auth import Identity
from gateway.serving.conductor import Conductor
from gateway.serving.readiness import readiness
from gateway.serving.reload import TenantsReloader
from gateway.serving.runtime import Runtime


def runtime_of(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


def conductor_of(request: Request) -> Conductor:
    """The conductor of the requests this app serves (`gateway.serving.conductor`)."""
    conductor: Conductor = request.app.state.conductor
    return conductor


def _model_object(name: str, config: ModelConfig) -> dict[str, object]:
    # `config_version` (beyond OpenAI's fields, which SDKs keep as extras) tells which
    # config of the model answered: `gateway eval` records it in its manifest.
    return {
        "id": name, "object": "model", "created": 0, "owned_by": "gateway",
        "config_version": model_config_version(config),
    }  # fmt: skip


def model_config_version(config: ModelConfig) -> str:
    """A short digest of one model's configuration."""
    return hashlib.sha256(config.model_dump_json().encode()).hexdigest()[:12]


async def list_models(request: Request) -> Response:
    """`GET /v1/models`: the models the caller's tenant may use."""
    runtime = runtime_of(request)
    identity = await runtime.auth.authenticate(request.headers.get("authorization"))
    data = [
        _model_object(name, route.config)
        for name, route in runtime.routes.items()
        if identity.may_use(name)
    ]
    return Response(orjson.dumps({"object": "list", "data": data}), media_type="application/json")


async def retrieve_model(request: Request) -> Response:
    """`GET /v1/models/{model}`: one model the caller's tenant may use; another tenant's
    model is a 404 like an unknown one (its existence is not told)."""
    runtime = runtime_of(request)
    identity = await runtime.auth.authenticate(request.headers.get("authorization"))
    name = request.path_params["model"]
    if name not in runtime.routes or not identity.may_use(name):
        raise model_not_found(name)
    body = _model_object(name, runtime.routes[name].config)
    return Response(orjson.dumps(body), media_type="application/json")


# `admin_scope` of a global admin: every tenant.
GLOBAL = "*"


async def admin_identity(request: Request, *, scoped: bool = False) -> Identity:
    """The caller, who must hold an admin tenant's key (else 401 or 403); with `scoped`,
    a tenant's own admin key (`admin_of`) will do too: the caller's `admin_scope` then
    says which tenant it may see (issue 40)."""
    identity = await runtime_of(request).auth.authenticate(request.headers.get("authorization"))
    scope = identity.admin_scope
    if scope is None:
        raise APIError(
            403, "This key may not use the admin API.", type="permission_error", code="not_admin"
        )
    if scope != GLOBAL and not scoped:
        raise APIError(
            403,
            f"This key administers the tenant {scope!r} only: this endpoint is for the "
            "gateway's own admins.",
            type="permission_error",
            code="not_global_admin",
        )
    return identity


def scoped_tenant(identity: Identity, tenant: str | None, tenants: Collection[str]) -> str | None:
    """The tenant an admin request is about: `tenant` as asked (None: every tenant, for a
    global admin), checked against what the caller may see. A scoped admin sees its own
    tenant only (None asks for it); any other name, like an unknown one, is a 404, so
    that it learns no other tenant's name."""
    scope = identity.admin_scope
    if scope != GLOBAL:
        tenant = scope if tenant is None else tenant
        if tenant != scope:
            raise tenant_not_found()
        return tenant
    if tenant is not None and tenant not in tenants:
        raise tenant_not_found()
    return tenant


def tenant_not_found() -> APIError:
    return APIError(404, "No tenant has that name.", param="tenant", code="tenant_not_found")


async def reload_tenants(request: Request) -> Response:
    """`POST /admin/reload`: reload the tenants file now (admin tenants only)."""
    identity = await admin_identity(request)
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


async def usage_report(request: Request) -> Response:
    """`GET /admin/usage?by=tenant,key,model&since=24h&until=...&tenant=...&format=csv`:
    what each group used and cost, from the usage ledger (admins only; a tenant's own
    admin sees its tenant's records only). `since` and `until` are ISO 8601 times or
    durations back from now (`gateway usage report`'s)."""
    store, tenant = await _usage_store(request)
    params = request.query_params
    try:
        query = ReportQuery(
            *_time_window(params), parse_group_by(params.get("by", "tenant")), tenant
        )
    except ValueError as exc:
        raise APIError(400, f"Bad usage query: {exc}", code="invalid_value") from None
    rows = await store.query(query)
    columns = report_columns(query)
    if params.get("format") == "csv":
        return Response(render_csv(rows, columns), media_type="text/csv")
    body = {
        "object": "usage_report",
        "currency": runtime_of(request).config.gateway.prices.currency,
        "since": query.since,
        "until": query.until,
        "group_by": list(query.group_by),
        "columns": columns,
        "rows": rows,
    }
    return Response(orjson.dumps(body), media_type="application/json")


async def usage_requests(request: Request) -> Response:
    """`GET /admin/usage/requests?key=ID&since=24h&until=...&limit=1000`: one key's
    requests, each as the ledger recorded it, oldest first (admins only; a tenant's own
    admin finds only its tenant's records: another tenant's key has none). A caller
    pages on with `since` set to the last record's `ts` (records at that time come
    again, known by their `request_id`)."""
    store, tenant = await _usage_store(request)
    params = request.query_params
    try:
        query = RequestsQuery(
            params.get("key", ""),
            *_time_window(params),
            int(params.get("limit", "1000")),
            tenant,
        )
    except ValueError as exc:
        raise APIError(400, f"Bad usage query: {exc}", code="invalid_value") from None
    records = await store.requests(query)
    body = {
        "object": "list",
        "key": query.key_id,
        "data": [dict(zip(COLUMNS, record.row(), strict=True)) for record in records],
    }
    return Response(orjson.dumps(body), media_type="application/json")


async def _usage_store(request: Request) -> tuple[LedgerStore, str | None]:
    """The usage ledger's store, for an admin's request (401 or 403 otherwise; 404 where
    the gateway keeps no ledger), and the tenant whose records it may read (`?tenant=`,
    a scoped admin's own; None: every tenant's)."""
    identity = await admin_identity(request, scoped=True)
    runtime = runtime_of(request)
    tenant = scoped_tenant(
        identity, request.query_params.get("tenant"), runtime.config.tenants.tenants
    )
    usage = runtime.usage
    if usage is None:
        raise APIError(404, "This gateway keeps no usage ledger (`ledger:` in gateway.yaml).")
    return usage.writer.store, tenant


def _time_window(params: QueryParams) -> tuple[float, float]:
    """A usage query's `since` (default a day back) and `until` (default now): ISO 8601
    times or durations back from now. ValueError for anything else."""
    now = time.time()
    since = point_in_time(params.get("since", "24h"), now)
    return since, point_in_time(params["until"], now) if "until" in params else now


async def metrics_endpoint(request: Request) -> Response:
    """`GET /metrics` on the ops listener: the Prometheus exposition, without a key; the
    OpenMetrics one (with exemplars) to a scraper that asks for it, as Prometheus does
    with `--enable-feature=exemplar-storage`."""
    if "application/openmetrics-text" in request.headers.get("accept", ""):
        return Response(metrics.render(openmetrics=True), media_type=OPENMETRICS_TYPE)
    return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)


async def metrics_for_admins(request: Request) -> Response:
    """`GET /metrics` on the API port: only for an admin tenant's key (the exposition
    names tenants, their traffic and the replicas' addresses)."""
    await admin_identity(request)
    return await metrics_endpoint(request)


async def openapi_json(request: Request) -> Response:
    """`/openapi.json`: the gateway's own endpoints, as it really accepts them, with the
    models it serves."""
    batches = getattr(request.app.state, "batches", None) is not None
    document = openapi_document(list(runtime_of(request).routes), batches=batches)
    return Response(orjson.dumps(document), media_type="application/json")


async def livez(request: Request) -> Response:
    """`/livez` (and `/healthz`, its older name): the process answers. A liveness probe
    restarts an instance that fails it; nothing outside the process is checked."""
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    """`/readyz`: 200 while this instance can serve under its fail modes (see
    `gateway.serving.readiness`), 503 when it cannot; the body lists each dependency."""
    state = await readiness(runtime_of(request))
    return JSONResponse(state.body(), status_code=200 if state.ready else 503)
