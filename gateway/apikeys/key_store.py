"""Managed keys in Redis, beside the rest of the gateway's state, under its key prefix:

- `{prefix}:{keys}:records`: a hash, key id -> the record's JSON (`ManagedKey.stored`);
- `{prefix}:{keys}:by_hash`: a hash, the key's hex digest -> key id;
- `{prefix}:{keys}:version`: a counter, INCR'd by every change, which every gateway's
  `KeyDirectory` polls (one GET) to know when to load the records again.

The three share one hash tag (`{keys}`): one Redis Cluster slot, so a change is one
MULTI/EXEC. A record is written before the counter moves, so a gateway that sees the new
version reads the new record.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import orjson
from redis.asyncio import RedisCluster

from gateway.apikeys.errors import KeyRevoked, UnknownKey
from gateway.apikeys.key_fields import KeyFields
from gateway.apikeys.managed_key import (
    SHOWN_PREFIX,
    ManagedKey,
    new_key_id,
    new_plain_key,
)
from gateway.config import hash_key
from gateway.storage.redis_client import RedisClient

TAG = "{keys}"


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
        )
        await self._write(key, old_digest=None)
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
        value = await self._redis.hget(self.records_key, key_id)
        if value is None:
            raise UnknownKey(key_id)
        return ManagedKey.from_stored(orjson.loads(value))

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
        """The key with the fields given in `fields.given` changed."""
        key = await self._live(key_id)
        changes: dict[str, object] = {}
        for name in ("name", "models", "expires_at", "budget", "limits"):
            if name in fields.given:
                changes[name] = getattr(fields, name)
        key = replace(key, **changes, updated_at=self._clock())  # type: ignore[arg-type]
        await self._write(key, old_digest=None)
        return key

    async def revoke(self, key_id: str) -> ManagedKey:
        """The key revoked (from now on every gateway refuses it); revoking a revoked
        key changes nothing."""
        key = await self.get(key_id)
        if key.revoked_at is not None:
            return key
        now = self._clock()
        key = replace(key, revoked_at=now, updated_at=now)
        await self._write(key, old_digest=None)
        return key

    async def rotate(self, key_id: str) -> tuple[ManagedKey, str]:
        """A new secret for the key (same id, name, budget...): (the record, the new
        plain key). The old secret stops working."""
        key = await self._live(key_id)
        plain = new_plain_key()
        rotated = key.with_secret(plain, self._clock())
        await self._write(rotated, old_digest=key.digest)
        return rotated, plain

    async def _live(self, key_id: str) -> ManagedKey:
        key = await self.get(key_id)
        if key.revoked_at is not None:
            raise KeyRevoked(key_id)
        return key

    async def _write(self, key: ManagedKey, old_digest: str | None) -> None:
        """The record, its hash index, then the counter: one MULTI/EXEC on a server; on
        a Redis Cluster one pipeline to the slot's node, in that order."""
        pipe = self._redis.pipeline(transaction=not isinstance(self._redis, RedisCluster))
        pipe.hset(self.records_key, key.id, orjson.dumps(key.stored()))
        pipe.hset(self.by_hash_key, key.digest, key.id)
        if old_digest is not None:
            pipe.hdel(self.by_hash_key, old_digest)
        pipe.incr(self.version_key)
        await pipe.execute()
