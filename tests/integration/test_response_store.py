"""Stored Responses API answers on a real redis-server, a Redis Cluster and fakeredis:
kept per tenant, under each tenant's quota (bytes and count, `lua/responses_store.lua`),
the room of a deleted or expired response given back."""

from __future__ import annotations

import asyncio
import secrets

import orjson
import pytest
from redis.asyncio import Redis, RedisCluster

from gateway.storage.response_store import (
    ENTRY_OVERHEAD,
    ResponseStore,
    StoreFull,
    StoreQuota,
    StoreUsage,
)

PREFIX = "test-resp"
MESSAGES = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
# The API key that stores them (a key id).
OWNER = "key_0123456789abcdef"
ROOMY = StoreQuota(max_bytes=10**9, max_count=10**6)


def response(response_id: str, text: str = "") -> dict[str, object]:
    return {"id": response_id, "object": "response", "output": [], "text": text}


def tenant_name() -> str:
    return f"t-{secrets.token_hex(4)}"


async def test_a_response_is_kept_read_and_deleted_for_its_tenant_only(
    client: Redis | RedisCluster,
) -> None:
    store = ResponseStore(client, PREFIX, ttl_s=60)
    tenant, other = tenant_name(), tenant_name()
    usage = await store.save(tenant, OWNER, response("resp_1"), MESSAGES, ROOMY, session="conv-7")
    assert usage.count == 1 and usage.bytes > ENTRY_OVERHEAD
    # With the session its conversation's next turns keep (cache-aware routing).
    stored = await store.load(tenant, "resp_1", OWNER)
    assert stored is not None
    assert stored.record == {
        "response": response("resp_1"),
        "messages": MESSAGES,
        "session": "conv-7",
    }
    assert stored.size + len(store._key(tenant, "resp_1")) + ENTRY_OVERHEAD == usage.bytes
    assert await store.load(other, "resp_1", OWNER) is None  # another tenant's id: not found
    assert not await store.delete(other, "resp_1", OWNER)
    assert await store.delete(tenant, "resp_1", OWNER)
    assert await store.load(tenant, "resp_1", OWNER) is None
    assert await store.usage(tenant) == StoreUsage(0, 0)


async def test_a_response_expires_after_its_ttl(client: Redis | RedisCluster) -> None:
    store = ResponseStore(client, PREFIX, ttl_s=0.2)
    tenant = tenant_name()
    await store.save(tenant, OWNER, response("resp_2"), MESSAGES, ROOMY)
    assert await store.load(tenant, "resp_2", OWNER) is not None
    await asyncio.sleep(0.35)
    assert await store.load(tenant, "resp_2", OWNER) is None
    # Its room is back too: the next call forgets what expired.
    assert await store.usage(tenant) == StoreUsage(0, 0)


async def test_the_count_quota_refuses_the_next_response_and_deleting_one_makes_room(
    client: Redis | RedisCluster,
) -> None:
    store = ResponseStore(client, PREFIX, ttl_s=60)
    tenant, other = tenant_name(), tenant_name()
    quota = StoreQuota(max_bytes=10**9, max_count=3)
    for n in range(3):
        await store.save(tenant, OWNER, response(f"resp_{n}"), MESSAGES, quota)
    with pytest.raises(StoreFull) as refused:
        await store.save(tenant, OWNER, response("resp_3"), MESSAGES, quota)
    assert refused.value.quota == "max_count"
    assert (refused.value.used, refused.value.limit) == (3, 3)
    assert await store.load(tenant, "resp_3", OWNER) is None  # nothing kept
    with pytest.raises(StoreFull):
        await store.room(tenant, quota)
    # Another tenant's quota is its own.
    await store.save(other, OWNER, response("resp_0"), MESSAGES, quota)
    assert await store.delete(tenant, "resp_1", OWNER)
    assert (await store.room(tenant, quota)).count == 2
    await store.save(tenant, OWNER, response("resp_3"), MESSAGES, quota)


async def test_the_byte_quota_counts_each_record_its_id_and_the_overhead(
    client: Redis | RedisCluster,
) -> None:
    store = ResponseStore(client, PREFIX, ttl_s=60)
    tenant = tenant_name()
    first = await store.save(tenant, OWNER, response("resp_a", "x" * 1000), MESSAGES, ROOMY)
    assert first.bytes > 1000 + ENTRY_OVERHEAD
    quota = StoreQuota(max_bytes=2 * first.bytes + 10, max_count=100)
    second = await store.save(tenant, OWNER, response("resp_b", "y" * 1000), MESSAGES, quota)
    assert second == StoreUsage(2 * first.bytes, 2)
    with pytest.raises(StoreFull) as refused:
        await store.save(tenant, OWNER, response("resp_c", "z" * 1000), MESSAGES, quota)
    assert refused.value.quota == "max_bytes"
    assert refused.value.usage == second
    # Nor does a small one: each response counts its id and the overhead too.
    with pytest.raises(StoreFull):
        await store.save(tenant, OWNER, response("resp_d", "z" * 20), MESSAGES, quota)
    # Before a request runs: room for its record's least size, or a refusal that says so.
    with pytest.raises(StoreFull) as full:
        await store.room(tenant, quota, need=1)
    assert (full.value.quota, full.value.need) == ("max_bytes", 1 + ENTRY_OVERHEAD)
    assert await store.delete(tenant, "resp_a", OWNER)
    await store.room(tenant, quota, need=first.bytes - ENTRY_OVERHEAD)
    with pytest.raises(StoreFull):
        await store.room(tenant, quota, need=first.bytes - ENTRY_OVERHEAD + 11)
    assert await store.usage(tenant) == StoreUsage(first.bytes, 1)


async def test_expired_responses_give_their_room_back(client: Redis | RedisCluster) -> None:
    short = ResponseStore(client, PREFIX, ttl_s=0.2)
    tenant = tenant_name()
    quota = StoreQuota(max_bytes=10**9, max_count=2)
    await short.save(tenant, OWNER, response("resp_1"), MESSAGES, quota)
    await short.save(tenant, OWNER, response("resp_2"), MESSAGES, quota)
    with pytest.raises(StoreFull):
        await short.room(tenant, quota)
    await asyncio.sleep(0.35)
    await short.save(tenant, OWNER, response("resp_3"), MESSAGES, quota)
    assert (await short.usage(tenant)).count == 1


async def test_gateways_sharing_redis_enforce_one_quota(client: Redis | RedisCluster) -> None:
    # Two stores (two gateways) saving at once: exactly the quota is kept, never more.
    stores = [ResponseStore(client, PREFIX, ttl_s=60) for _ in range(2)]
    tenant = tenant_name()
    quota = StoreQuota(max_bytes=10**9, max_count=10)

    async def save(n: int) -> bool:
        try:
            await stores[n % 2].save(tenant, OWNER, response(f"resp_{n}"), MESSAGES, quota)
        except StoreFull:
            return False
        return True

    kept = await asyncio.gather(*(save(n) for n in range(40)))
    assert sum(kept) == 10
    assert (await stores[0].usage(tenant)).count == 10


async def test_the_books_expire_with_the_last_response(client: Redis | RedisCluster) -> None:
    store = ResponseStore(client, PREFIX, ttl_s=60)
    tenant = tenant_name()
    await store.save(tenant, OWNER, response("resp_1"), MESSAGES, ROOMY)
    for key in store._books(tenant):
        ttl = await client.pttl(key)
        assert 60_000 < ttl <= 120_000  # the response's TTL and a minute


async def test_a_response_is_its_owner_s_only(client: Redis | RedisCluster) -> None:
    # Issue 40: another API key of the same tenant cannot read, continue or delete it.
    store = ResponseStore(client, PREFIX, ttl_s=60)
    tenant, other_key = tenant_name(), "0123456789ab"
    await store.save(tenant, OWNER, response("resp_1"), MESSAGES, ROOMY)
    assert await store.load(tenant, "resp_1", other_key) is None
    assert not await store.delete(tenant, "resp_1", other_key)
    assert await store.load(tenant, "resp_1", OWNER) is not None  # still there
    # The admin API reads any key's, with its owner.
    stored = await store.load(tenant, "resp_1", None)
    assert stored is not None and stored.owner == OWNER
    assert (await store.usage(tenant)).count == 1
    assert await store.delete(tenant, "resp_1", None)
    assert (await store.usage(tenant)).count == 0


async def test_a_record_of_before_owners_is_the_admin_s_only(
    client: Redis | RedisCluster,
) -> None:
    # Written by the gateway before issue 40 (JSON alone, no owner line): no API key finds
    # it, whichever it was; the admin API reads it, until it expires.
    store = ResponseStore(client, PREFIX, ttl_s=60)
    tenant = tenant_name()
    record = {"response": response("resp_old"), "messages": MESSAGES, "session": None}
    await client.set(store._key(tenant, "resp_old"), orjson.dumps(record), px=60_000)
    assert await store.load(tenant, "resp_old", OWNER) is None
    assert not await store.delete(tenant, "resp_old", OWNER)
    stored = await store.load(tenant, "resp_old", None)
    assert stored is not None and stored.owner is None and stored.record == record
    assert await store.delete(tenant, "resp_old", None)  # not in the quota's books: no harm
    assert await store.usage(tenant) == StoreUsage(0, 0)


@pytest.mark.parametrize("owner", ["", "two\nlines", "{json"])
async def test_an_owner_must_be_a_key_id(client: Redis | RedisCluster, owner: str) -> None:
    store = ResponseStore(client, PREFIX, ttl_s=60)
    with pytest.raises(ValueError):
        await store.save(tenant_name(), owner, response("resp_1"), MESSAGES, ROOMY)
