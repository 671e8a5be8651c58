"""Idempotency-Key records on a real redis-server, a Redis Cluster and fakeredis.

The shared Redis on 6379 is never touched: the servers are the tests' own.
"""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis, RedisCluster
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.storage.idempotency_store import (
    Begin,
    BeginState,
    IdempotencyStore,
    InvalidIdempotencyKey,
    StoredResponse,
    fingerprint,
)
from gateway_tools.dev.processes import free_port
from tests.integration.redis_backends import fresh_tenant

PREFIX = "gw"
TTL_S = 60.0
FP = fingerprint("/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 4})
OTHER_FP = fingerprint("/v1/completions", {"model": "m", "prompt": "bye", "max_tokens": 4})
# Not UTF-8, and with newlines: stored and returned byte for byte.
# The API key that sends them (a key id).
OWNER = "key_0123456789abcdef"
BODY = b'{"id":"cmpl-1","choices":[{"text":"a\\nb"}]}\n\xff\x00\n'
HEADERS = {"content-type": "application/json", "x-request-id": "req-1"}


@pytest.fixture
def store(client: Redis | RedisCluster) -> IdempotencyStore:
    return IdempotencyStore(client, PREFIX, TTL_S)


async def test_fresh_then_in_progress_then_done_with_the_same_bytes(
    store: IdempotencyStore, client: Redis | RedisCluster
) -> None:
    tenant = fresh_tenant()
    assert await store.begin(tenant, OWNER, "key-1", FP) == Begin(BeginState.FRESH)
    assert await store.begin(tenant, OWNER, "key-1", FP) == Begin(BeginState.IN_PROGRESS)
    headers = {**HEADERS, "Set-Cookie": "session=secret"}
    assert await store.complete(tenant, OWNER, "key-1", 200, BODY, headers)
    for _ in range(2):
        repeat = await store.begin(tenant, OWNER, "key-1", FP)
        assert repeat == Begin(
            BeginState.DONE,
            StoredResponse(200, tuple(HEADERS.items()), BODY),
        )
    # Stored for the TTL, under the digest of the client's key, not the key itself.
    key = store.key(tenant, OWNER, "key-1")
    assert "key-1" not in key
    assert 0 < await client.pttl(key) <= TTL_S * 1000


async def test_a_different_request_under_the_same_key_is_a_mismatch(
    store: IdempotencyStore,
) -> None:
    tenant = fresh_tenant()
    await store.begin(tenant, OWNER, "key-1", FP)
    assert (await store.begin(tenant, OWNER, "key-1", OTHER_FP)).state is BeginState.MISMATCH
    await store.complete(tenant, OWNER, "key-1", 200, BODY)
    assert (await store.begin(tenant, OWNER, "key-1", OTHER_FP)).state is BeginState.MISMATCH
    assert (await store.begin(tenant, OWNER, "key-1", FP)).state is BeginState.DONE


async def test_abandon_lets_a_retry_run_but_never_drops_a_response(
    store: IdempotencyStore,
) -> None:
    tenant = fresh_tenant()
    await store.begin(tenant, OWNER, "key-1", FP)
    assert await store.abandon(tenant, OWNER, "key-1")
    assert not await store.abandon(tenant, OWNER, "key-1")
    # Abandoned: a completion arriving now finds no run to complete.
    assert not await store.complete(tenant, OWNER, "key-1", 200, BODY)
    assert (await store.begin(tenant, OWNER, "key-1", FP)).state is BeginState.FRESH
    assert await store.complete(tenant, OWNER, "key-1", 201, b"{}")
    assert not await store.abandon(tenant, OWNER, "key-1")
    done = await store.begin(tenant, OWNER, "key-1", FP)
    assert done.response == StoredResponse(201, (), b"{}")
    # The first response stays: a second completion does not replace it.
    assert not await store.complete(tenant, OWNER, "key-1", 500, b"late")
    assert (await store.begin(tenant, OWNER, "key-1", FP)).response == done.response


async def test_records_expire(client: Redis | RedisCluster) -> None:
    store = IdempotencyStore(client, PREFIX, ttl_s=0.2, in_progress_ttl_s=0.2)
    tenant = fresh_tenant()
    await store.begin(tenant, OWNER, "done", FP)
    await store.complete(tenant, OWNER, "done", 200, BODY)
    await store.begin(tenant, OWNER, "crashed", FP)  # never completed: the gateway died
    assert (await store.begin(tenant, OWNER, "done", FP)).state is BeginState.DONE
    assert (await store.begin(tenant, OWNER, "crashed", FP)).state is BeginState.IN_PROGRESS
    await asyncio.sleep(0.35)
    assert (await store.begin(tenant, OWNER, "done", FP)).state is BeginState.FRESH
    assert (await store.begin(tenant, OWNER, "crashed", FP)).state is BeginState.FRESH


async def test_tenants_do_not_share_keys(store: IdempotencyStore) -> None:
    acme, other = fresh_tenant(), fresh_tenant()
    assert (await store.begin(acme, OWNER, "same-key", FP)).state is BeginState.FRESH
    assert (await store.begin(other, OWNER, "same-key", OTHER_FP)).state is BeginState.FRESH
    await store.complete(acme, OWNER, "same-key", 200, b"acme")
    await store.complete(other, OWNER, "same-key", 200, b"other")
    acme_done = await store.begin(acme, OWNER, "same-key", FP)
    other_done = await store.begin(other, OWNER, "same-key", OTHER_FP)
    assert acme_done.response is not None and acme_done.response.body == b"acme"
    assert other_done.response is not None and other_done.response.body == b"other"
    # Each key sits in its tenant's hash slot, like the tenant's rate-limit buckets.
    key = store.key(acme, OWNER, "same-key")
    assert key.startswith(f"{PREFIX}:{{{acme}}}:idem:")
    assert key_slot(key.encode()) == key_slot(acme.encode())


async def test_each_api_key_of_a_tenant_has_its_own_key_space(store: IdempotencyStore) -> None:
    # Issue 40: a second key re-sending the first key's Idempotency-Key with the same
    # body runs its own request: it is never replayed the first key's answer, nor told
    # the key is in use or was used for another request.
    tenant, other_key = fresh_tenant(), "0123456789ab"
    assert (await store.begin(tenant, OWNER, "shared", FP)).state is BeginState.FRESH
    assert (await store.begin(tenant, other_key, "shared", FP)).state is BeginState.FRESH
    await store.complete(tenant, OWNER, "shared", 200, b"first key's answer")
    again = await store.begin(tenant, other_key, "shared", FP)
    assert again.state is BeginState.IN_PROGRESS  # its own run, still going
    assert (await store.begin(tenant, other_key, "shared", OTHER_FP)).state is (
        BeginState.MISMATCH  # against its own record, not the first key's
    )
    await store.complete(tenant, other_key, "shared", 200, b"second key's answer")
    first = await store.begin(tenant, OWNER, "shared", FP)
    second = await store.begin(tenant, other_key, "shared", FP)
    assert first.response is not None and first.response.body == b"first key's answer"
    assert second.response is not None and second.response.body == b"second key's answer"
    assert not await store.abandon(tenant, other_key, "shared")  # done: never dropped
    key = store.key(tenant, other_key, "shared")
    assert key != store.key(tenant, OWNER, "shared")
    assert key_slot(key.encode()) == key_slot(tenant.encode())  # still the tenant's slot


def test_an_owner_is_a_key_id(store: IdempotencyStore) -> None:
    for owner in ("", "a\0b"):
        with pytest.raises(ValueError):
            store.key("acme", owner, "k")


async def test_concurrent_duplicates_run_once(store: IdempotencyStore) -> None:
    tenant = fresh_tenant()
    results = await asyncio.gather(*(store.begin(tenant, OWNER, "key-1", FP) for _ in range(20)))
    states = [r.state for r in results]
    assert states.count(BeginState.FRESH) == 1
    assert states.count(BeginState.IN_PROGRESS) == 19


async def test_invalid_keys_and_fingerprints_are_refused(store: IdempotencyStore) -> None:
    tenant = fresh_tenant()
    for key in ("", "x" * 256, "caf\u00e9", "line\nbreak"):
        with pytest.raises(InvalidIdempotencyKey):
            await store.begin(tenant, OWNER, key, FP)
    with pytest.raises(ValueError):
        await store.begin(tenant, OWNER, "key-1", "two\nlines")
    assert (await store.begin(tenant, OWNER, "x" * 255, FP)).state is BeginState.FRESH


def test_fingerprints_ignore_json_key_order_but_not_the_path() -> None:
    body = {"model": "m", "prompt": "hi", "max_tokens": 4}
    reordered = {"max_tokens": 4, "prompt": "hi", "model": "m"}
    assert fingerprint("/v1/completions", reordered) == FP
    assert fingerprint("/v1/chat/completions", body) != FP
    assert fingerprint("/v1/completions", b'{"a":1}') != fingerprint("/v1/completions", b'{"a": 1}')


async def test_redis_errors_reach_the_caller() -> None:
    # Nothing listens on a fresh free port.
    redis = Redis(port=free_port(), socket_connect_timeout=0.5)
    try:
        store = IdempotencyStore(redis, PREFIX, TTL_S)
        with pytest.raises(RedisConnectionError):
            await store.begin(fresh_tenant(), OWNER, "key-1", FP)
    finally:
        await redis.aclose()
