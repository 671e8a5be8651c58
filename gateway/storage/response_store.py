"""Stored Responses API answers (`store: true`): the response object and the
conversation that led to it, so that `previous_response_id` can continue it.

One Redis string per response, `{prefix}:{{tenant}}:resp:<id>`, holding its owner (the
id of the API key that made it) on a line of its own, then JSON `{"response": <the
response object>, "messages": [<the conversation, as chat messages>], "session": ...}`,
with a TTL. The tenant's hash tag keeps it in the tenant's Redis Cluster slot, and a key
is only ever read under the caller's own tenant, so another tenant's id is not found;
a response read, continued or deleted by another API key than its owner is not found
either (issue 40). A record written before owners were kept (it starts with `{`) has
no owner: no API key finds it, only the admin API (`owner=None`), until it expires.

Each tenant's responses are under its quota (`StoreQuota`: bytes and count), kept
atomically in Redis by `lua/responses_store.lua` beside them, in the same slot: an
expiry index (a sorted set of id -> expiry), each response's size (a hash) and the
total. Every call forgets the responses whose expiry has passed first, so a response
that expires or is deleted gives its room back, on every gateway at once.

The conversation is stored whole (each response holds its whole history), so that one
GET continues it: memory grows with a conversation's length, the TTL bounds how long
any of it stays, and the quota how much of it a tenant holds at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from redis.asyncio import Redis, RedisCluster

from gateway.storage.redis_keys import hash_tag
from gateway.storage.scripts import read_script

_STORE_LUA = read_script("responses_store.lua")
# What one response counts for beyond its record and id: its entries in the expiry index
# and the sizes hash, and Redis's own overhead per key (measured: docs/coding-tools.md).
ENTRY_OVERHEAD = 256
# An owner is a key id (`key_<hex>`, or 12 hex digits): never a newline, never a `{`.
_OWNER_END = b"\n"


@dataclass(frozen=True, slots=True)
class StoreQuota:
    """What one tenant's stored responses may hold at once."""

    max_bytes: int
    max_count: int


@dataclass(frozen=True, slots=True)
class StoreUsage:
    """What one tenant's stored responses hold, as Redis counted them."""

    bytes: int
    count: int


class StoreFull(Exception):
    """A tenant's stored responses are at their quota: `quota` names the cap reached
    (`max_bytes` or `max_count`)."""

    def __init__(
        self, tenant: str, quota: str, usage: StoreUsage, limits: StoreQuota, need: int = 0
    ) -> None:
        super().__init__(f"stored responses of {tenant!r} at {quota}")
        self.tenant = tenant
        self.quota = quota
        self.usage = usage
        self.limits = limits
        # The bytes the response refused needed (at least).
        self.need = need

    @property
    def limit(self) -> int:
        return self.limits.max_bytes if self.quota == "max_bytes" else self.limits.max_count

    @property
    def used(self) -> int:
        return self.usage.bytes if self.quota == "max_bytes" else self.usage.count


@dataclass(frozen=True, slots=True)
class Stored:
    """A stored response: its record, its size as stored (bytes), and its owner (None:
    written before owners were kept)."""

    record: dict[str, Any]
    size: int
    owner: str | None = None


def check_owner(owner: str) -> str:
    """`owner` if it can head a record (a key id), else ValueError."""
    if not owner or "\n" in owner or owner.startswith("{"):
        raise ValueError(f"not a key id: {owner!r}")
    return owner


class ResponseStore:
    """Responses kept per tenant for `ttl_s` seconds, under each tenant's quota."""

    def __init__(self, redis: Redis | RedisCluster, prefix: str, ttl_s: float) -> None:
        self._redis = redis
        self._prefix = prefix
        self.ttl_s = ttl_s
        self._script = redis.register_script(_STORE_LUA)

    def _key(self, tenant: str, response_id: str) -> str:
        return f"{self._prefix}:{{{hash_tag(tenant)}}}:resp:{response_id}"

    def _books(self, tenant: str) -> list[str]:
        """The tenant's expiry index, sizes and total (`lua/responses_store.lua`)."""
        base = f"{self._prefix}:{{{hash_tag(tenant)}}}:resp_quota"
        return [f"{base}:expiry", f"{base}:sizes", f"{base}:bytes"]

    async def _call(self, tenant: str, key: str, args: list[Any]) -> tuple[int, str, StoreUsage]:
        status, quota, total, count = await self._script([*self._books(tenant), key], args)
        text = quota.decode() if isinstance(quota, bytes) else str(quota)
        return int(status), text, StoreUsage(int(total), int(count))

    async def room(self, tenant: str, quota: StoreQuota, need: int = 0) -> StoreUsage:
        """What the tenant's responses hold, if there is room for one more of at least
        `need` bytes (its record; the id and overhead are added); `StoreFull` if not
        (before a request that would store its answer is run)."""
        books = self._books(tenant)
        least = need + ENTRY_OVERHEAD
        done, cap, usage = await self._call(
            tenant, books[2], ["room", quota.max_bytes, quota.max_count, least]
        )
        if not done:
            raise StoreFull(tenant, f"max_{cap}", usage, quota, least)
        return usage

    async def save(
        self,
        tenant: str,
        owner: str,
        response: dict[str, Any],
        messages: list[dict[str, Any]],
        quota: StoreQuota,
        session: str | None = None,
    ) -> StoreUsage:
        """Keep `response`, its conversation and the session it continues (the key that
        keeps the conversation's requests on one replica), as `owner`'s (a key id); what
        the tenant's responses hold now. `StoreFull` (nothing kept) if it does not fit."""
        record = {"response": response, "messages": messages, "session": session}
        value = check_owner(owner).encode() + _OWNER_END + orjson.dumps(record)
        response_id = str(response["id"])
        key = self._key(tenant, response_id)
        size = len(value) + len(key) + ENTRY_OVERHEAD
        ttl_ms = max(1, round(self.ttl_s * 1000))
        args = ["save", quota.max_bytes, quota.max_count, response_id, value, ttl_ms, size]
        done, cap, usage = await self._call(tenant, key, args)
        if not done:
            raise StoreFull(tenant, f"max_{cap}", usage, quota, size)
        return usage

    async def load(self, tenant: str, response_id: str, owner: str | None) -> Stored | None:
        """The stored response and conversation, or None (unknown, expired, another
        tenant's, or another key's than `owner`; None: any key's, for the admin API)."""
        found_value = await self._redis.get(self._key(tenant, response_id))
        if found_value is None:
            return None
        # The client returns bytes (`decode_responses=False`).
        value = found_value.encode() if isinstance(found_value, str) else bytes(found_value)
        size = len(value)
        found: str | None = None
        if not value.startswith(b"{"):
            head, _, value = value.partition(_OWNER_END)
            found = head.decode()
        if owner is not None and found != owner:
            return None
        return Stored(orjson.loads(value), size, found)

    async def delete(self, tenant: str, response_id: str, owner: str | None) -> bool:
        """Forget a response of `owner`'s (None: of any key's, for the admin API), giving
        its room back; whether there was one."""
        header = "" if owner is None else check_owner(owner) + "\n"
        done, _, _ = await self._call(
            tenant, self._key(tenant, response_id), ["delete", response_id, header]
        )
        return bool(done)

    async def usage(self, tenant: str) -> StoreUsage:
        """What the tenant's responses hold now (expired ones forgotten first)."""
        books = self._books(tenant)
        _, _, usage = await self._call(tenant, books[2], ["room", 1 << 62, 1 << 62, 0])
        return usage
