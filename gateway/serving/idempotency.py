"""`Idempotency-Key` on whole answers: a repeat within the TTL gets the stored answer
instead of a second run. Streams are not covered (they cannot be replayed).

Wire-neutral: a claim is made on the key and the request's fingerprint (the HTTP layer
computes it from the body as sent), and an answer is stored as the bytes, status and
`x-` headers it went out with. While Redis is unreachable requests run without the
guarantee rather than fail.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from gateway.serving.auth import Identity, owner_of
from gateway.serving.errors import IdempotencyKeyInUse, IdempotencyKeyReused, InvalidRequest
from gateway.storage.idempotency_store import (
    IN_PROGRESS_RETRY_AFTER_S,
    BeginState,
    IdempotencyStore,
    InvalidIdempotencyKey,
)
from gateway.storage.redis_client import REDIS_ERRORS

log = logging.getLogger("gateway.idempotency")

REPLAYED_HEADER = "idempotent-replayed"


@dataclass(slots=True)
class Reply:
    """A whole answer as it goes out: its status, its JSON body and its headers."""

    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class IdempotencyClaim:
    """A request that runs under an idempotency key (or under none: `key` is None)."""

    store: IdempotencyStore | None = None
    tenant: str = ""
    # The API key that sent it: each key has a key space of its own.
    owner: str = ""
    key: str | None = None

    async def complete(self, reply: Reply) -> None:
        """Store a successful answer for repeats of the key."""
        if self.store is None or self.key is None:
            return
        headers = {k: v for k, v in reply.headers.items() if k.startswith("x-")}
        try:
            await self.store.complete(
                self.tenant, self.owner, self.key, reply.status, reply.body, headers
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


UNCLAIMED = IdempotencyClaim()


async def claim(
    store: IdempotencyStore, identity: Identity, key: str, fingerprint: str
) -> IdempotencyClaim | Reply:
    """Claim `key` for a request whose fingerprint is `fingerprint`, or the stored answer
    of the request that claimed it before. `InvalidRequest` for a malformed key,
    `IdempotencyKeyInUse` while the first still runs, `IdempotencyKeyReused` when it
    was another request."""
    owner = owner_of(identity)
    try:
        begin = await store.begin(identity.name, owner, key, fingerprint)
    except InvalidIdempotencyKey as exc:
        raise InvalidRequest(f"{exc}.", "Idempotency-Key") from None
    except REDIS_ERRORS as exc:
        log.warning("idempotency unavailable (%s): running the request", type(exc).__name__)
        return UNCLAIMED
    if begin.state is BeginState.FRESH:
        return IdempotencyClaim(store, identity.name, owner, key)
    if begin.state is BeginState.DONE:
        assert begin.response is not None
        stored = begin.response
        headers = {**dict(stored.headers), REPLAYED_HEADER: "true"}
        return Reply(stored.status, stored.body, headers)
    if begin.state is BeginState.IN_PROGRESS:
        raise IdempotencyKeyInUse(IN_PROGRESS_RETRY_AFTER_S)
    raise IdempotencyKeyReused
