"""`Idempotency-Key` for non-streaming requests: a repeat gets the first answer, not a rerun.

As with Stripe and the IETF draft "The Idempotency-Key HTTP Header Field":

- the first request with a key runs, under an in-progress marker (SET NX PX);
- a repeat after it finished gets the stored status, headers and body, byte for byte;
- a repeat while it runs gets IN_PROGRESS (the caller answers 409 with Retry-After);
- a repeat with a different request (fingerprint) gets MISMATCH (the caller answers 422);
- a run that failed in a retryable way is abandoned, so the client's retry runs again.

One Redis string per key, `{prefix}:{{tenant}}:idem:<sha256 of owner NUL client key>`:
the tenant's hash tag keeps it in the tenant's Redis Cluster slot, the digest keeps the
client's key (whatever it contains) out of Redis. The owner is the API key that sent it
(its key id): each API key has a key space of its own, so another key of the same
tenant re-sending the same Idempotency-Key runs its own request and is never replayed
the first key's answer (issue 40). Records written before the owner was part of the
digest are not found again: a retry that straddles that upgrade runs once more. The
value is either

    b"R" + fingerprint                                   in progress
    b"D" + fingerprint + b"\\n" + meta + b"\\n" + body   done; meta is JSON (status, headers)

so the body is stored raw, and `complete` takes the fingerprint from the marker. Each
operation is one Lua call (`lua/idempotency_*.lua`), atomic on its key. Redis errors
propagate: the caller decides (it skips idempotency when Redis is down).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson
from redis.asyncio import Redis, RedisCluster

from gateway.storage.redis_keys import hash_tag
from gateway.storage.scripts import read_script

# What the caller puts in Retry-After when a duplicate arrives while the first runs.
IN_PROGRESS_RETRY_AFTER_S = 1
# Longest client key accepted (Stripe's limit).
MAX_KEY_LENGTH = 255
# Must outlast the longest request (`timeouts.total_s`): it only matters when the
# gateway dies mid-request, and a marker gone too early lets a duplicate run.
DEFAULT_IN_PROGRESS_TTL_S = 600.0

_RUNNING = b"R"
_DONE = b"D"
# Response headers never stored, whatever the caller passes: credentials.
_SECRET_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key", "api-key"}
)
# One Lua script per operation, each atomic on its key.
_BEGIN_LUA = read_script("idempotency_begin.lua")
_COMPLETE_LUA = read_script("idempotency_complete.lua")
_ABANDON_LUA = read_script("idempotency_abandon.lua")


class InvalidIdempotencyKey(ValueError):
    """The client's Idempotency-Key is empty, too long, or not printable ASCII (a 400)."""


class BeginState(StrEnum):
    """What `IdempotencyStore.begin` found."""

    FRESH = "fresh"  # run the request, then `complete` or `abandon`
    DONE = "done"  # answer with the stored response
    IN_PROGRESS = "in_progress"  # a duplicate while the first runs: 409 + Retry-After
    MISMATCH = "mismatch"  # the key was used for a different request: 422


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """A finished response, as stored under its key."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes


@dataclass(frozen=True, slots=True)
class Begin:
    """The outcome of `begin`; `response` is set exactly when `state` is DONE."""

    state: BeginState
    response: StoredResponse | None = None


def check_key(key: str) -> None:
    """Raise `InvalidIdempotencyKey` unless `key` is 1 to 255 printable ASCII characters."""
    if not key or len(key) > MAX_KEY_LENGTH:
        raise InvalidIdempotencyKey(
            f"Idempotency-Key must be 1 to {MAX_KEY_LENGTH} characters long"
        )
    if not all(" " <= c <= "~" for c in key):
        raise InvalidIdempotencyKey("Idempotency-Key must be printable ASCII")


def fingerprint(path: str, body: bytes | Mapping[str, Any]) -> str:
    """A digest of a request, to tell a repeat from a different request under one key.

    Pass the parsed JSON body to ignore key order and whitespace (sorted keys), or the
    raw bytes to compare exactly.
    """
    if isinstance(body, bytes):
        raw = body
    else:
        # orjson serializes dicts only, not other mappings.
        payload = body if isinstance(body, dict) else dict(body)
        raw = orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(path.encode() + b"\0" + raw).hexdigest()


class IdempotencyStore:
    """Idempotency records in Redis (single server or Cluster), per tenant.

    The client must return bytes (redis-py's default, `decode_responses=False`).
    """

    def __init__(
        self,
        redis: Redis | RedisCluster,
        prefix: str,
        ttl_s: float,
        in_progress_ttl_s: float = DEFAULT_IN_PROGRESS_TTL_S,
    ) -> None:
        if "{" in prefix or "}" in prefix:
            # A brace in the prefix would make it the hash tag: every tenant on one slot.
            raise ValueError(f"key prefix must not contain braces: {prefix!r}")
        # Written as positive checks so NaN fails them too.
        if not (0 < ttl_s < math.inf and 0 < in_progress_ttl_s < math.inf):
            raise ValueError(
                f"idempotency TTLs must be positive, not {ttl_s} and {in_progress_ttl_s}"
            )
        self._prefix = prefix
        # PX takes whole ms, at least 1.
        self._ttl_ms = max(1, round(ttl_s * 1000))
        self._in_progress_ttl_ms = max(1, round(in_progress_ttl_s * 1000))
        self._begin = redis.register_script(_BEGIN_LUA)
        self._complete = redis.register_script(_COMPLETE_LUA)
        self._abandon = redis.register_script(_ABANDON_LUA)

    def key(self, tenant: str, owner: str, key: str) -> str:
        """The Redis key of the client's `key` (validated), sent by the API key `owner`
        of `tenant`."""
        check_key(key)
        if not owner or "\0" in owner:
            raise ValueError(f"not a key id: {owner!r}")
        digest = hashlib.sha256(owner.encode() + b"\0" + key.encode()).hexdigest()
        return f"{self._prefix}:{{{hash_tag(tenant)}}}:idem:{digest}"

    async def begin(self, tenant: str, owner: str, key: str, request_fingerprint: str) -> Begin:
        """Claim `key` for a run of the request, or report what already holds it."""
        if not request_fingerprint or "\n" in request_fingerprint:
            # The fingerprint ends at the first newline of a stored record.
            raise ValueError("request fingerprint must be non-empty, without newlines")
        expected = request_fingerprint.encode()
        record: bytes | None = await self._begin(
            [self.key(tenant, owner, key)], [_RUNNING + expected, self._in_progress_ttl_ms]
        )
        if record is None:
            return Begin(BeginState.FRESH)
        kind, rest = record[:1], record[1:]
        if kind == _RUNNING:
            if rest != expected:
                return Begin(BeginState.MISMATCH)
            return Begin(BeginState.IN_PROGRESS)
        if kind == _DONE:
            stored, meta, body = rest.split(b"\n", 2)
            if stored != expected:
                return Begin(BeginState.MISMATCH)
            return Begin(BeginState.DONE, _response(meta, body))
        raise ValueError(f"unknown idempotency record kind {kind!r}")

    async def complete(
        self,
        tenant: str,
        owner: str,
        key: str,
        status: int,
        body: bytes,
        headers: Mapping[str, str] | Iterable[tuple[str, str]] = (),
    ) -> bool:
        """Store the response of a FRESH run for the TTL; repeats get it from now on.

        False (nothing stored) if the in-progress marker is gone: it expired or was
        abandoned, so another run may own the key by now.
        """
        pairs = headers.items() if isinstance(headers, Mapping) else headers
        kept = [[name, value] for name, value in pairs if name.lower() not in _SECRET_HEADERS]
        meta = orjson.dumps({"status": status, "headers": kept})
        stored: int = await self._complete(
            [self.key(tenant, owner, key)], [meta + b"\n" + body, self._ttl_ms]
        )
        return stored == 1

    async def abandon(self, tenant: str, owner: str, key: str) -> bool:
        """Drop the in-progress marker of a run that failed retryably, so a retry may run.

        A stored response is never dropped. False if there was no marker.
        """
        deleted: int = await self._abandon([self.key(tenant, owner, key)])
        return deleted == 1


def _response(meta: bytes, body: bytes) -> StoredResponse:
    decoded = orjson.loads(meta)
    headers = tuple((str(name), str(value)) for name, value in decoded["headers"])
    return StoredResponse(int(decoded["status"]), headers, body)
