"""Managed keys in Redis, beside the rest of the gateway's state, under its key prefix:

- `{prefix}:{keys}:records`: a hash, key id -> the record's JSON (`ManagedKey.stored`);
- `{prefix}:{keys}:by_hash`: a hash, the key's hex digest -> key id;
- `{prefix}:{keys}:version`: a counter, INCR'd by every change, which every gateway's
  `KeyDirectory` polls (one GET) to know when to load the records again.

The three share one hash tag (`{keys}`): one Redis Cluster slot, so a change is one Lua
call (`lua/key_write.lua`). It writes the record only if it is still the one the change
was made from (compare-and-set), and the caller reads it again and redoes the change if
not: a PATCH racing a revoke cannot bring the key back, nor one racing a rotate keep the
old secret. A record is written before the counter moves, so a gateway that sees the new
version reads the new record.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import orjson

from gateway.apikeys.errors import KeyChangeConflict, KeyRevoked, UnknownKey
from gateway.apikeys.key_fields import KeyFields
from gateway.apikeys.managed_key import (
    SHOWN_PREFIX,
    ManagedKey,
    new_key_id,
    new_plain_key,
)
from gateway.config import hash_key
from gateway.storage.redis_client import RedisClient
from gateway.storage.scripts import read_script

TAG = "{keys}"
WRITE_LUA = read_script("key_write.lua")

# Times a change is redone after another change to the same key won the race. Changes
# to one key come from operators, so more than a few at once means something is looping.
MAX_ATTEMPTS = 8

Change = Callable[[ManagedKey], tuple[ManagedKey, str | None] | None]


class KeyStore:
    """Create, list, read, change, revoke and rotate managed keys."""

    def __init__(
        self, redis: RedisClient, prefix: str, clock: Callable[[], float] = time.time
    ) -> None:
        self._redis = redis
        self._clock = clock
        self.records_key = f"{prefix}:{TAG}:records"
        self.by_hash_key = f"{prefix}:{TAG}:by_hash"
        self.version_key = f"{prefix}:{TAG}:version"
        self._write_script = redis.register_script(WRITE_LUA)

    async def version(self) -> int:
        """The change counter (0 before the first change)."""
        value = await self._redis.get(self.version_key)
        return 0 if value is None else int(value)

    async def load(self) -> tuple[int, dict[str, ManagedKey]]:
        """(version, every key by id), the version read first: a change made between the
        two reads moves the counter again, and the next poll loads once more."""
        version = await self.version()
        return version, await self._all()

    async def _all(self) -> dict[str, ManagedKey]:
        found = await self._redis.hgetall(self.records_key)
        keys = {}
        for value in found.values():
            key = ManagedKey.from_stored(orjson.loads(value))
            keys[key.id] = key
        return keys

    async def create(self, tenant: str, fields: KeyFields) -> tuple[ManagedKey, str]:
        """A new key of `tenant`: (its record, the plain key, which is not kept)."""
        plain = new_plain_key()
        now = self._clock()
        key = ManagedKey(
            id=new_key_id(),
            tenant=tenant,
            name=fields.name,
            key_hash=hash_key(plain),
            prefix=plain[:SHOWN_PREFIX],
            last4=plain[-4:],
            created_at=now,
            models=fields.models,
            expires_at=fields.expires_at,
            budget=fields.budget,
            limits=fields.limits,
            admin_of=fields.admin_of,
            mcp_tools=fields.mcp_tools,
        )
        # A new id is random (collisions are not expected); written only if it is free.
        if not await self._write(key, expected=None, old_digest=None):
            raise KeyChangeConflict(key.id)
        return key, plain

    async def list(self, tenant: str | None = None) -> list[ManagedKey]:
        """Every key (of `tenant`, if given), oldest first."""
        keys = (await self._all()).values()
        return sorted(
            (k for k in keys if tenant is None or k.tenant == tenant),
            key=lambda k: (k.created_at, k.id),
        )

    async def get(self, key_id: str) -> ManagedKey:
        """The key `key_id`; `UnknownKey` if there is none."""
        return (await self._read(key_id))[0]

    async def _read(self, key_id: str) -> tuple[ManagedKey, bytes]:
        """(the key, its record as stored: what a change compares against)."""
        value = await self._redis.hget(self.records_key, key_id)
        if value is None:
            raise UnknownKey(key_id)
        raw = value.encode() if isinstance(value, str) else bytes(value)
        return ManagedKey.from_stored(orjson.loads(raw)), raw

    async def find(self, digest: str) -> ManagedKey | None:
        """The key whose hex digest is `digest`, if any."""
        key_id = await self._redis.hget(self.by_hash_key, digest)
        if key_id is None:
            return None
        try:
            return await self.get(key_id.decode() if isinstance(key_id, bytes) else key_id)
        except UnknownKey:
            return None

    async def update(self, key_id: str, fields: KeyFields) -> ManagedKey:
        """The key with the fields given in `fields.given` changed (of its limits, those
        in `fields.limits_given`)."""
        changes: dict[str, object] = {
            name: getattr(fields, name)
            for name in ("name", "models", "expires_at", "budget", "admin_of", "mcp_tools")
            if name in fields.given
        }

        def change(key: ManagedKey) -> tuple[ManagedKey, str | None]:
            _refuse_revoked(key)
            if "limits" in fields.given:
                # Only the limits given change: `--tpm` alone keeps the key's rpm.
                given = {n: getattr(fields.limits, n) for n in fields.limits_given}
                changes["limits"] = replace(key.limits, **given)
            return replace(key, **changes, updated_at=self._clock()), None  # type: ignore[arg-type]

        return await self._change(key_id, change)

    async def revoke(self, key_id: str) -> ManagedKey:
        """The key revoked (from now on every gateway refuses it); revoking a revoked
        key changes nothing."""

        def change(key: ManagedKey) -> tuple[ManagedKey, str | None] | None:
            if key.revoked_at is not None:
                return None
            now = self._clock()
            return replace(key, revoked_at=now, updated_at=now), None

        return await self._change(key_id, change)

    async def rotate(self, key_id: str) -> tuple[ManagedKey, str]:
        """A new secret for the key (same id, name, budget...): (the record, the new
        plain key). The old secret stops working."""
        plain = new_plain_key()

        def change(key: ManagedKey) -> tuple[ManagedKey, str | None]:
            _refuse_revoked(key)
            return key.with_secret(plain, self._clock()), key.digest

        return await self._change(key_id, change), plain

    async def _change(self, key_id: str, change: Change) -> ManagedKey:
        """Read the key, apply `change` (None: nothing to change; else the new record
        and a digest to drop from the index) and write it if nobody changed the key
        meanwhile, else start again from what they wrote."""
        for _ in range(MAX_ATTEMPTS):
            key, raw = await self._read(key_id)
            changed = change(key)
            if changed is None:
                return key
            new, old_digest = changed
            if await self._write(new, expected=raw, old_digest=old_digest):
                return new
        raise KeyChangeConflict(key_id)

    async def _write(self, key: ManagedKey, expected: bytes | None, old_digest: str | None) -> bool:
        """The record, its hash index, then the counter, in one Lua call, if the record
        stored is still `expected` (None: there is none). Whether it was written."""
        written = await self._write_script(
            keys=[self.records_key, self.by_hash_key, self.version_key],
            args=[
                key.id,
                expected or b"",
                orjson.dumps(key.stored()),
                key.digest,
                old_digest or "",
            ],
        )
        return bool(written)


def _refuse_revoked(key: ManagedKey) -> None:
    """A revoked key stays revoked: it is not changed nor given a new secret."""
    if key.revoked_at is not None:
        raise KeyRevoked(key.id)
