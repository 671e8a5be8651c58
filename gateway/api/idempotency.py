"""`Idempotency-Key` on non-streaming completions: a repeat within the TTL gets the stored
answer instead of a second run. Streams are not covered (they cannot be replayed).

While Redis is unreachable requests run without the guarantee rather than fail.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from gateway.api import errors
from gateway.api.errors import APIError
from gateway.api.tool_lists import ToolsJSON
from gateway.inference.types import InferenceRequest
from gateway.serving.auth import Identity, owner_of
from gateway.serving.runtime import Runtime
from gateway.storage.idempotency_store import (
    IN_PROGRESS_RETRY_AFTER_S,
    BeginState,
    IdempotencyStore,
    InvalidIdempotencyKey,
    fingerprint,
)
from gateway.storage.redis_client import REDIS_ERRORS

log = logging.getLogger("gateway.idempotency")

REPLAYED_HEADER = "idempotent-replayed"


@dataclass(slots=True)
class IdempotencyClaim:
    """A request that runs under an idempotency key (or under none: `key` is None)."""

    store: IdempotencyStore | None = None
    tenant: str = ""
    # The API key that sent it: each key has a key space of its own.
    owner: str = ""
    key: str | None = None

    async def complete(self, response: Response) -> None:
        """Store a successful answer for repeats of the key."""
        if self.store is None or self.key is None:
            return
        headers = {k: v for k, v in response.headers.items() if k.startswith("x-")}
        try:
            await self.store.complete(
                self.tenant,
                self.owner,
                self.key,
                response.status_code,
                bytes(response.body),
                headers,
            )
        except REDIS_ERRORS as exc:
            log.warning("idempotency result not stored (%s)", type(exc).__name__)

    async def abandon(self) -> None:
        """Free the key after a failure, so that a retry may run."""
        if self.store is None or self.key is None:
            return
        try:
            await self.store.abandon(self.tenant, self.owner, self.key)
        except REDIS_ERRORS as exc:
            log.warning("idempotency key not released (%s)", type(exc).__name__)


_NONE = IdempotencyClaim()


def _as_json(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """The body as JSON values: `tools`, left as the client's text, as that text."""
    tools = data.get("tools")
    if not isinstance(tools, ToolsJSON):
        return data
    return {**data, "tools": orjson.Fragment(tools.text)}


async def claim(
    runtime: Runtime,
    identity: Identity,
    request: Request,
    inference: InferenceRequest,
    data: Mapping[str, Any],
) -> IdempotencyClaim | Response:
    """Claim the request's `Idempotency-Key`, or answer a repeat of it."""
    key = request.headers.get("idempotency-key")
    if key is None or inference.stream:
        return _NONE
    store = runtime.idempotency
    owner = owner_of(identity)
    try:
        begin = await store.begin(
            identity.name, owner, key, fingerprint(request.url.path, _as_json(data))
        )
    except InvalidIdempotencyKey as exc:
        raise errors.bad_request(f"{exc}.", "Idempotency-Key") from None
    except REDIS_ERRORS as exc:
        log.warning("idempotency unavailable (%s): running the request", type(exc).__name__)
        return _NONE
    if begin.state is BeginState.FRESH:
        return IdempotencyClaim(store, identity.name, owner, key)
    if begin.state is BeginState.DONE:
        assert begin.response is not None
        stored = begin.response
        headers = {**dict(stored.headers), REPLAYED_HEADER: "true"}
        return Response(stored.body, stored.status, headers=headers, media_type="application/json")
    if begin.state is BeginState.IN_PROGRESS:
        raise APIError(
            409,
            "A request with this Idempotency-Key is still running; retry later.",
            code="idempotency_key_in_use",
            retry_after_s=IN_PROGRESS_RETRY_AFTER_S,
        )
    raise APIError(
        422,
        "This Idempotency-Key was used with a different request.",
        code="idempotency_key_reused",
        param="Idempotency-Key",
    )
