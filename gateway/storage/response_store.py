"""Stored Responses API answers (`store: true`): the response object and the
conversation that led to it, so that `previous_response_id` can continue it.

One Redis string per response, `{prefix}:{{tenant}}:resp:<id>`, holding JSON
`{"response": <the response object>, "messages": [<the conversation, as chat messages>]}`
with a TTL: the tenant's hash tag keeps it in the tenant's Redis Cluster slot, and a
key is only ever read under the caller's own tenant, so another tenant's id is not
found. The conversation is stored whole (each response holds its whole history), so
that one GET continues it: memory grows with a conversation's length, and the TTL
bounds how long any of it stays.
"""

from __future__ import annotations

from typing import Any

import orjson
from redis.asyncio import Redis, RedisCluster

from gateway.storage.redis_keys import hash_tag


class ResponseStore:
    """Responses kept per tenant for `ttl_s` seconds."""

    def __init__(self, redis: Redis | RedisCluster, prefix: str, ttl_s: float) -> None:
        self._redis = redis
        self._prefix = prefix
        self.ttl_s = ttl_s

    def _key(self, tenant: str, response_id: str) -> str:
        return f"{self._prefix}:{{{hash_tag(tenant)}}}:resp:{response_id}"

    async def save(
        self,
        tenant: str,
        response: dict[str, Any],
        messages: list[dict[str, Any]],
        session: str | None = None,
    ) -> int:
        """Keep `response`, its conversation and the session it continues (the key that
        keeps the conversation's requests on one replica); the bytes stored."""
        record = {"response": response, "messages": messages, "session": session}
        value = orjson.dumps(record)
        ttl_ms = max(1, round(self.ttl_s * 1000))
        await self._redis.set(self._key(tenant, response["id"]), value, px=ttl_ms)
        return len(value)

    async def load(self, tenant: str, response_id: str) -> dict[str, Any] | None:
        """The stored response and conversation, or None (unknown, expired, another
        tenant's)."""
        value = await self._redis.get(self._key(tenant, response_id))
        if value is None:
            return None
        stored: dict[str, Any] = orjson.loads(value)
        return stored

    async def delete(self, tenant: str, response_id: str) -> bool:
        """Forget a response; whether there was one."""
        return bool(await self._redis.delete(self._key(tenant, response_id)))
