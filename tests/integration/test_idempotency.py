"""gateway.serving.idempotency: a claim on an Idempotency-Key, wire-neutral, on a real
redis-server, a Redis Cluster and fakeredis: the first request runs, a repeat gets the
stored answer byte for byte, a repeat while it runs or with another body is refused, a
failed run frees the key, and each API key has a key space of its own."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis, RedisCluster

from gateway.config import TenantsConfig
from gateway.serving.auth import Identity
from gateway.serving.errors import IdempotencyKeyInUse, IdempotencyKeyReused, InvalidRequest
from gateway.serving.idempotency import REPLAYED_HEADER, IdempotencyClaim, Reply, claim
from gateway.storage.idempotency_store import IdempotencyStore, fingerprint
from tests.integration.redis_backends import fresh_tenant

FP = fingerprint("/v1/chat/completions", {"model": "m", "messages": [], "n": 1})
OTHER_FP = fingerprint("/v1/chat/completions", {"model": "m", "messages": [], "n": 2})
ANSWER = Reply(200, b'{"id":"chatcmpl-1"}\n\xff', {"x-request-id": "r1", "content-type": "a/b"})


def identity(tenant: str, key_id: str = "key_a") -> Identity:
    config: Any = TenantsConfig.model_validate(
        {"tenants": {tenant: {"api_keys": ["sha256:" + "0" * 64]}}}
    )
    return Identity(tenant, config.tenants[tenant], key_id=key_id)


@pytest.fixture
def store(client: Redis | RedisCluster) -> IdempotencyStore:
    return IdempotencyStore(client, "gw", 60.0)


async def test_a_repeat_gets_the_stored_answer_and_says_it_is_one(store: IdempotencyStore) -> None:
    caller = identity(fresh_tenant())
    first = await claim(store, caller, "k-1", FP)
    assert isinstance(first, IdempotencyClaim)
    await first.complete(ANSWER)
    repeat = await claim(store, caller, "k-1", FP)
    assert isinstance(repeat, Reply)
    assert (repeat.status, repeat.body) == (200, ANSWER.body)
    # Only the gateway's own headers are kept, and the replay is marked.
    assert repeat.headers == {"x-request-id": "r1", REPLAYED_HEADER: "true"}


async def test_a_repeat_while_it_runs_or_with_another_body_is_refused(
    store: IdempotencyStore,
) -> None:
    caller = identity(fresh_tenant())
    assert isinstance(await claim(store, caller, "k-1", FP), IdempotencyClaim)
    with pytest.raises(IdempotencyKeyInUse) as in_use:
        await claim(store, caller, "k-1", FP)
    assert in_use.value.retry_after_s > 0
    with pytest.raises(IdempotencyKeyReused):
        await claim(store, caller, "k-1", OTHER_FP)


async def test_a_failed_run_frees_the_key_for_a_retry(store: IdempotencyStore) -> None:
    caller = identity(fresh_tenant())
    first = await claim(store, caller, "k-1", FP)
    assert isinstance(first, IdempotencyClaim)
    await first.abandon()
    assert isinstance(await claim(store, caller, "k-1", FP), IdempotencyClaim)


async def test_each_api_key_has_a_key_space_of_its_own(store: IdempotencyStore) -> None:
    tenant = fresh_tenant()
    first = await claim(store, identity(tenant, "key_a"), "k-1", FP)
    assert isinstance(first, IdempotencyClaim)
    await first.complete(ANSWER)
    # The tenant's other key, same Idempotency-Key: a run of its own, not key_a's answer.
    assert isinstance(await claim(store, identity(tenant, "key_b"), "k-1", FP), IdempotencyClaim)


@pytest.mark.parametrize("key", ["", "x" * 10_000, "bad\nkey", "\x00"])
async def test_a_malformed_key_is_a_400_naming_the_header(
    store: IdempotencyStore, key: str
) -> None:
    with pytest.raises(InvalidRequest) as refused:
        await claim(store, identity(fresh_tenant()), key, FP)
    assert refused.value.param == "Idempotency-Key"
