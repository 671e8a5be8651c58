"""`/admin/keys`: managed API keys, for admin tenants, where `/admin/usage` is served.

    POST   /admin/keys               {tenant, name, models, expires_at, budget, limits,
                                      admin_of, mcp_tools}
                                     -> 201 {id, key (shown this once), ...the record}
    GET    /admin/keys[?tenant=]     -> {object: list, data: [records]}
    GET    /admin/keys/{id}          -> the record
    PATCH  /admin/keys/{id}          {name, models, expires_at, budget, limits, admin_of,
                                      mcp_tools} -> the record
    DELETE /admin/keys/{id}          -> the record, revoked
    POST   /admin/keys/{id}/rotate   -> {key (shown this once), ...the record}

A record never holds the key's hash; the plain key is in the answer of a create or a
rotate only, and in no log. Every gateway honours a change within a second
(`gateway.apikeys.key_directory`).

Who may (issue 40): a key of an `admin: true` tenant is a global admin, every tenant's
keys are its to manage. A managed key with `admin_of` (its own tenant; only a global
admin sets it) is that tenant's admin: it manages that tenant's keys and no other's. It
cannot set `admin_of` on any key, itself included (no admin makes another, nor widens
its own scope); another tenant's key, asked for by id, is a 404 as an unknown one, and
another tenant named in a create is a 403 (in a list, a 404 as an unknown name).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from gateway.api.body import decode_json
from gateway.api.endpoints import GLOBAL, admin_identity, runtime_of, scoped_tenant
from gateway.api.errors import APIError
from gateway.api.exchange import read_body
from gateway.apikeys import KeyStore, ManagedKey
from gateway.apikeys.errors import KeyChangeConflict, KeyRequestInvalid, KeyRevoked, UnknownKey
from gateway.apikeys.key_fields import create_fields, update_fields
from gateway.serving.auth import Identity
from gateway.serving.runtime import Runtime

log = logging.getLogger("gateway.keys")

# A key's fields fit in far less; a bigger body is refused before it is read whole.
MAX_BODY_BYTES = 64 * 1024
MAX_ID = 64


def _json(body: object, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def _store(runtime: Runtime) -> KeyStore:
    if runtime.key_store is None:
        raise APIError(404, "This gateway keeps no managed keys.", code="not_found")
    return runtime.key_store


def _invalid(exc: KeyRequestInvalid) -> APIError:
    return APIError(400, exc.message, param=exc.param, code="invalid_value")


def _not_found(key_id: str) -> APIError:
    shown = key_id if len(key_id) <= MAX_ID else key_id[:MAX_ID] + "…"
    return APIError(404, f"No API key has the id {shown!r}.", param="id", code="key_not_found")


def _revoked(key_id: str) -> APIError:
    return APIError(
        409, f"The API key {key_id!r} is revoked: it cannot be changed.", code="key_revoked"
    )


def _conflict(key_id: str) -> APIError:
    return APIError(
        409, f"The API key {key_id!r} was being changed by others at the same time; "
        "nothing was changed. Send the change again.", code="key_change_conflict",
    )  # fmt: skip


async def _body(request: Request) -> dict[str, Any]:
    data = decode_json(await read_body(request, MAX_BODY_BYTES))
    return dict(data)


async def _key(store: KeyStore, key_id: str, admin: Identity) -> ManagedKey:
    """The key `key_id`, if `admin` may see it (a scoped admin: a key of its tenant);
    404 otherwise, as for an unknown id."""
    if len(key_id) > MAX_ID:
        raise _not_found(key_id)
    try:
        key = await store.get(key_id)
    except UnknownKey:
        raise _not_found(key_id) from None
    if admin.admin_scope not in (GLOBAL, key.tenant):
        raise _not_found(key_id)
    return key


def _may_set_admin_of(admin: Identity, data: dict[str, Any]) -> None:
    """Only a global admin makes or unmakes a tenant's admin (`admin_of`)."""
    if "admin_of" in data and admin.admin_scope != GLOBAL:
        raise APIError(
            403,
            "Only the gateway's own admins may set `admin_of`: a tenant's admin cannot "
            "make another admin nor change its own scope.",
            type="permission_error",
            param="admin_of",
            code="not_global_admin",
        )


def _who(admin: Identity) -> str:
    """The admin tenant and the key that acted (its id: no secret)."""
    return f"{admin.name} ({admin.key_id})" if admin.key_id else admin.name


async def _changed(runtime: Runtime, action: str, by: str, key: ManagedKey) -> None:
    """Log the change, and see it here at once (the other gateways within a second)."""
    _log(action, by, key)
    if runtime.key_directory is not None:
        await runtime.key_directory.refresh_from_now()


def _log(action: str, by: str, key: ManagedKey) -> None:
    log.warning(
        "managed key %s %s (tenant %s) by %s",
        key.id,
        action,
        key.tenant,
        by,
        extra={"fields": {"event": "managed_key", "action": action, "key_id": key.id,
                          "tenant": key.tenant, "by": by}},
    )  # fmt: skip


async def create_key(request: Request) -> Response:
    """`POST /admin/keys`: a new key; the answer holds the key itself, this once."""
    admin = await admin_identity(request, scoped=True)
    runtime = runtime_of(request)
    store = _store(runtime)
    data = await _body(request)
    _may_set_admin_of(admin, data)
    scope = admin.admin_scope
    if scope != GLOBAL and data.get("tenant") != scope:
        raise APIError(
            403,
            f"This key administers the tenant {scope!r} only: it makes keys of that tenant.",
            type="permission_error",
            param="tenant",
            code="tenant_not_administered",
        )
    try:
        tenant, fields = create_fields(
            data, runtime.config.tenants.tenants, runtime.routes.keys(), time.time()
        )
    except KeyRequestInvalid as exc:
        raise _invalid(exc) from None
    try:
        key, plain = await store.create(tenant, fields)
    except KeyChangeConflict as exc:
        raise _conflict(str(exc)) from None
    await _changed(runtime, "created", _who(admin), key)
    return _json({**key.public(), "key": plain}, status=201)


async def list_keys(request: Request) -> Response:
    """`GET /admin/keys[?tenant=NAME]`: every key (of one tenant; a tenant's own admin:
    of its tenant), without secrets."""
    admin = await admin_identity(request, scoped=True)
    runtime = runtime_of(request)
    tenant = scoped_tenant(
        admin, request.query_params.get("tenant"), runtime.config.tenants.tenants
    )
    keys = await _store(runtime).list(tenant)
    return _json({"object": "list", "data": [key.public() for key in keys]})


async def get_key(request: Request) -> Response:
    """`GET /admin/keys/{id}`."""
    admin = await admin_identity(request, scoped=True)
    key = await _key(_store(runtime_of(request)), request.path_params["key_id"], admin)
    return _json(key.public())


async def update_key(request: Request) -> Response:
    """`PATCH /admin/keys/{id}`: the fields given changed (null clears models, expiry,
    budget, MCP tools)."""
    admin = await admin_identity(request, scoped=True)
    runtime = runtime_of(request)
    store = _store(runtime)
    key = await _key(store, request.path_params["key_id"], admin)
    data = await _body(request)
    _may_set_admin_of(admin, data)
    tenant = runtime.config.tenants.tenants.get(key.tenant)
    if tenant is None:
        raise APIError(
            409, f"The key's tenant {key.tenant!r} is no longer in the tenants file.",
            code="tenant_not_found",
        )  # fmt: skip
    try:
        fields = update_fields(data, key.tenant, tenant, runtime.routes.keys(), time.time())
        key = await store.update(key.id, fields)
    except KeyRequestInvalid as exc:
        raise _invalid(exc) from None
    except UnknownKey:
        raise _not_found(key.id) from None
    except KeyRevoked:
        raise _revoked(key.id) from None
    except KeyChangeConflict:
        raise _conflict(key.id) from None
    await _changed(runtime, "updated", _who(admin), key)
    return _json(key.public())


async def revoke_key(request: Request) -> Response:
    """`DELETE /admin/keys/{id}`: revoked, on every gateway within a second."""
    admin = await admin_identity(request, scoped=True)
    runtime = runtime_of(request)
    store = _store(runtime)
    key = await _key(store, request.path_params["key_id"], admin)
    try:
        key = await store.revoke(key.id)
    except UnknownKey:
        raise _not_found(key.id) from None
    except KeyChangeConflict:
        raise _conflict(key.id) from None
    await _changed(runtime, "revoked", _who(admin), key)
    return _json(key.public())


async def rotate_key(request: Request) -> Response:
    """`POST /admin/keys/{id}/rotate`: a new secret, shown this once; the old one stops
    working."""
    admin = await admin_identity(request, scoped=True)
    runtime = runtime_of(request)
    store = _store(runtime)
    key = await _key(store, request.path_params["key_id"], admin)
    try:
        key, plain = await store.rotate(key.id)
    except UnknownKey:
        raise _not_found(key.id) from None
    except KeyRevoked:
        raise _revoked(key.id) from None
    except KeyChangeConflict:
        raise _conflict(key.id) from None
    await _changed(runtime, "rotated", _who(admin), key)
    return _json({**key.public(), "key": plain})
