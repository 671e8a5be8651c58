"""Stored Responses API answers on a real redis-server, a Redis Cluster and fakeredis."""

from __future__ import annotations

import asyncio
import secrets

from redis.asyncio import Redis, RedisCluster

from gateway.storage.response_store import ResponseStore

PREFIX = "test-resp"
MESSAGES = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


def response(response_id: str) -> dict[str, object]:
    return {"id": response_id, "object": "response", "output": []}


async def test_a_response_is_kept_read_and_deleted_for_its_tenant_only(
    client: Redis | RedisCluster,
) -> None:
    store = ResponseStore(client, PREFIX, ttl_s=60)
    tenant, other = f"t-{secrets.token_hex(4)}", f"o-{secrets.token_hex(4)}"
    size = await store.save(tenant, response("resp_1"), MESSAGES, session="conv-7")
    assert size > 0
    # With the session its conversation's next turns keep (cache-aware routing).
    assert await store.load(tenant, "resp_1") == {
        "response": response("resp_1"),
        "messages": MESSAGES,
        "session": "conv-7",
    }
    assert await store.load(other, "resp_1") is None  # another tenant's id: not found
    assert not await store.delete(other, "resp_1")
    assert await store.delete(tenant, "resp_1")
    assert await store.load(tenant, "resp_1") is None


async def test_a_response_expires_after_its_ttl(client: Redis | RedisCluster) -> None:
    store = ResponseStore(client, PREFIX, ttl_s=0.2)
    tenant = f"t-{secrets.token_hex(4)}"
    await store.save(tenant, response("resp_2"), MESSAGES)
    assert await store.load(tenant, "resp_2") is not None
    await asyncio.sleep(0.35)
    assert await store.load(tenant, "resp_2") is None
