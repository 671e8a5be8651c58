"""Managed keys in real Redis (a redis-server, a Redis Cluster, fakeredis): the store's
create, list, get, update, revoke and rotate; two gateways' directories that see a
create and a revoke within a second; one look in flight for any number of unknown keys."""

from __future__ import annotations

import asyncio
import hashlib
import itertools

import pytest
from redis.asyncio import Redis, RedisCluster

from gateway.apikeys import KeyDirectory, KeyStore, ManagedKey
from gateway.apikeys.errors import KeyRevoked, UnknownKey
from gateway.apikeys.key_directory import POLL_INTERVAL_S
from gateway.apikeys.key_fields import KeyFields
from gateway.apikeys.managed_key import KeyLimits
from gateway.config import Budget, Tenant, hash_key
from gateway.serving.auth import Authenticator, InvalidApiKey
from tests.polling import wait_until

_prefixes = itertools.count()


def _prefix() -> str:
    return f"keys-test-{next(_prefixes)}"


def _digest(plain: str) -> str:
    return hashlib.sha256(plain.encode()).hexdigest()


async def test_create_list_get_update_revoke(client: Redis | RedisCluster) -> None:
    store = KeyStore(client, _prefix())
    assert await store.version() == 0
    budget = Budget(amount=0.05, period="day")
    key, plain = await store.create(
        "acme", KeyFields(name="ci", models=("llm-small",), budget=budget)
    )
    assert plain.startswith("sk-") and len(plain) == 35
    assert key.id.startswith("key_") and len(key.id) == 20
    assert key.key_hash == hash_key(plain) and plain not in str(key.stored())
    assert await store.version() == 1
    other, _ = await store.create("globex", KeyFields(name="dev"))
    assert [k.id for k in await store.list()] == [key.id, other.id]
    assert [k.id for k in await store.list("acme")] == [key.id]
    assert await store.get(key.id) == key
    assert await store.find(_digest(plain)) == key
    public = key.public()
    assert "key_hash" not in public and key.digest not in str(public)
    assert public["display"].startswith(plain[:7]) and public["display"].endswith(plain[-4:])

    changed = await store.update(
        key.id, KeyFields(name="ci-2", models=None, given=frozenset({"name", "models"}))
    )
    assert (changed.name, changed.models, changed.budget) == ("ci-2", None, budget)
    assert (await store.get(key.id)).name == "ci-2"
    assert await store.version() == 3

    revoked = await store.revoke(key.id)
    assert revoked.revoked_at is not None and revoked.status() == "revoked"
    assert (await store.revoke(key.id)).revoked_at == revoked.revoked_at  # no change
    with pytest.raises(KeyRevoked):
        await store.update(key.id, KeyFields(name="x", given=frozenset({"name"})))
    with pytest.raises(KeyRevoked):
        await store.rotate(key.id)
    with pytest.raises(UnknownKey):
        await store.get("key_0000000000000000")
    with pytest.raises(UnknownKey):
        await store.revoke("key_0000000000000000")


async def test_rotate_gives_a_new_secret_and_the_old_stops_working(
    client: Redis | RedisCluster,
) -> None:
    store = KeyStore(client, _prefix())
    key, old = await store.create("acme", KeyFields(name="ci"))
    rotated, new = await store.rotate(key.id)
    assert new != old and rotated.id == key.id and rotated.name == "ci"
    assert await store.find(_digest(new)) == rotated
    assert await store.find(_digest(old)) is None
    directory = KeyDirectory(store)
    await directory.refresh()
    assert directory.lookup(_digest(new)) == rotated
    assert directory.lookup(_digest(old)) is None


TENANTS = {"acme": Tenant(api_keys=[hash_key("sk-file-acme")], models=["*"])}
FILE_KEYS = {_digest("sk-file-acme"): "acme"}


async def test_a_create_and_a_revoke_reach_another_gateway_at_its_next_look(
    redis: Redis,
) -> None:
    prefix = _prefix()
    # Two gateways: each its own client, store and directory, on one Redis. The other
    # one looks only when told (its poll does the same every POLL_INTERVAL_S).
    here, there = KeyStore(redis, prefix), KeyStore(redis, prefix)
    directory = KeyDirectory(there, interval_s=3600)
    await directory.start()
    auth = Authenticator(TENANTS, FILE_KEYS, directory)
    try:
        key, plain = await here.create("acme", KeyFields(name="ci"))

        def known() -> bool:
            try:
                return auth.identify(f"Bearer {plain}").key_id == key.id
            except InvalidApiKey:
                return False

        assert not known()  # identify reads memory only: it never looks itself
        looks = directory.lookups
        await directory.refresh()  # one look, as the poll's
        assert known() and directory.lookups == looks + 1
        await here.revoke(key.id)
        assert known()
        await directory.refresh()
        assert not known() and directory.lookups == looks + 2
    finally:
        await directory.stop()


async def test_the_poll_looks_on_its_own(redis: Redis) -> None:
    """What makes the look above come within a second on a running gateway: the poll,
    every POLL_INTERVAL_S, with no request to prompt it."""
    assert POLL_INTERVAL_S < 1
    prefix = _prefix()
    here = KeyStore(redis, prefix)
    directory = KeyDirectory(KeyStore(redis, prefix), interval_s=0.01)
    await directory.start()
    try:
        key, plain = await here.create("acme", KeyFields(name="polled"))

        async def loaded() -> bool:
            return directory.lookup(_digest(plain)) is not None

        await wait_until(loaded)  # a hang guard: nothing but the poll looks here
        assert directory.lookup(_digest(plain)) == key
    finally:
        await directory.stop()


class CountingStore(KeyStore):
    """A store that counts the version reads in flight at once."""

    in_flight = 0
    most_in_flight = 0

    async def version(self) -> int:
        CountingStore.in_flight += 1
        CountingStore.most_in_flight = max(CountingStore.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.01)  # a slow Redis: the misses pile up meanwhile
            return await super().version()
        finally:
            CountingStore.in_flight -= 1


async def test_unknown_keys_share_one_look_and_a_new_key_works_at_once(redis: Redis) -> None:
    prefix = _prefix()
    here = KeyStore(redis, prefix)
    # Polling never on its own here: only misses make the directory look.
    directory = KeyDirectory(CountingStore(redis, prefix), interval_s=3600)
    await directory.start()
    auth = Authenticator(TENANTS, FILE_KEYS, directory)
    try:
        looks = directory.lookups
        bad = [auth.authenticate(f"Bearer sk-bad-{i}") for i in range(500)]
        results = await asyncio.gather(*bad, return_exceptions=True)
        assert all(isinstance(r, InvalidApiKey) for r in results)
        assert CountingStore.most_in_flight == 1
        assert directory.lookups - looks <= 2  # 500 misses, one look (or two)

        # Made on another gateway, used here an instant later: the miss looks again.
        key, plain = await here.create("acme", KeyFields(name="fresh"))
        identity = await auth.authenticate(f"Bearer {plain}")
        assert (identity.key_id, identity.key_name, identity.name) == (key.id, "fresh", "acme")
        # The file's keys go on working, without a look.
        looks = directory.lookups
        assert (await auth.authenticate("Bearer sk-file-acme")).name == "acme"
        assert directory.lookups == looks
    finally:
        await directory.stop()


async def test_redis_down_keeps_the_keys_loaded_last(redis: Redis) -> None:
    prefix = _prefix()
    store = KeyStore(redis, prefix)
    key, plain = await store.create("acme", KeyFields(name="ci"))
    directory = KeyDirectory(store, interval_s=3600)
    await directory.start()
    try:
        # Redis goes away: the same store on a client of a port nobody listens on.
        gone = Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
        directory._store = KeyStore(gone, prefix)
        await directory.refresh()
        await directory.refresh()
        auth = Authenticator(TENANTS, FILE_KEYS, directory)
        assert auth.identify(f"Bearer {plain}").key_id == key.id
        with pytest.raises(InvalidApiKey):
            await auth.authenticate("Bearer sk-unknown")
        await gone.aclose()
    finally:
        await directory.stop()


async def test_changes_racing_a_revoke_or_a_rotate_never_undo_it(
    client: Redis | RedisCluster,
) -> None:
    """Two operators at once: a PATCH sent with a DELETE cannot bring the key back, and
    one sent with a rotate cannot keep the old secret working (each change is made from
    the record it read, or redone from the one that won)."""
    store = KeyStore(client, _prefix())
    rename = KeyFields(name="renamed", given=frozenset({"name"}))
    for _ in range(20):
        key, _ = await store.create("acme", KeyFields(name="ci"))
        outcomes = await asyncio.gather(
            store.update(key.id, rename), store.revoke(key.id), return_exceptions=True
        )
        assert not isinstance(outcomes[1], BaseException)
        assert isinstance(outcomes[0], KeyRevoked) or outcomes[0].name == "renamed"
        final = await store.get(key.id)
        assert final.revoked_at is not None

        key, old = await store.create("acme", KeyFields(name="ci"))
        _, (rotated, new) = await asyncio.gather(store.update(key.id, rename), store.rotate(key.id))
        final = await store.get(key.id)
        assert final.name == "renamed" and final.key_hash == rotated.key_hash
        assert await store.find(_digest(old)) is None
        assert await store.find(_digest(new)) == final


async def test_changing_one_limit_keeps_the_other(client: Redis | RedisCluster) -> None:
    """`gateway keys update --tpm N` alone keeps the key's rpm (found by the hostile
    review: it cleared it, and the key was looser than before); null clears both."""
    store = KeyStore(client, _prefix())
    key, _ = await store.create("acme", KeyFields(name="ci", limits=KeyLimits(2, 100_000)))
    tpm = KeyFields(
        limits=KeyLimits(None, 50_000),
        given=frozenset({"limits"}),
        limits_given=frozenset({"tokens_per_minute"}),
    )
    assert (await store.update(key.id, tpm)).limits == KeyLimits(2, 50_000)
    cleared = KeyFields(
        given=frozenset({"limits"}),
        limits_given=frozenset({"requests_per_minute", "tokens_per_minute"}),
    )
    assert (await store.update(key.id, cleared)).limits == KeyLimits()


async def test_a_key_s_mcp_tools_are_kept_changed_and_cleared(
    client: Redis | RedisCluster,
) -> None:
    """`mcp_tools` (issue 45): kept with the key, changed by an update that gives it and
    kept by one that does not; null is all of the tenant's again."""
    store = KeyStore(client, _prefix())
    key, plain = await store.create("acme", KeyFields(name="ci", mcp_tools=("notes/echo",)))
    assert (await store.get(key.id)).mcp_tools == ("notes/echo",)
    assert (await store.find(_digest(plain))) == key
    renamed = await store.update(key.id, KeyFields(name="ci-2", given=frozenset({"name"})))
    assert renamed.mcp_tools == ("notes/echo",)
    widened = KeyFields(mcp_tools=("notes", "github/*"), given=frozenset({"mcp_tools"}))
    assert (await store.update(key.id, widened)).mcp_tools == ("notes", "github/*")
    cleared = await store.update(key.id, KeyFields(given=frozenset({"mcp_tools"})))
    assert cleared.mcp_tools is None and (await store.get(key.id)).mcp_tools is None


class GatedStore(KeyStore):
    """A store whose loads wait at a gate after reading, as a slow Redis would."""

    gate: asyncio.Event

    async def load(self) -> tuple[int, dict[str, ManagedKey]]:
        found = await super().load()
        await self.gate.wait()
        return found


async def test_a_change_made_while_a_look_is_in_flight_is_seen_at_once(redis: Redis) -> None:
    """The look in flight read before the revoke; the gateway that revoked must not go on
    serving the key from it (found by the hostile review: 7 requests served on a revoked
    key for 0.1 s after DELETE answered)."""
    prefix = _prefix()
    here = KeyStore(redis, prefix)
    key, plain = await here.create("acme", KeyFields(name="ci"))
    gated = GatedStore(redis, prefix)
    gated.gate = asyncio.Event()
    gated.gate.set()
    directory = KeyDirectory(gated, interval_s=3600)
    await directory.start()
    try:
        await here.update(key.id, KeyFields(name="ci-2", given=frozenset({"name"})))
        gated.gate.clear()
        stale = asyncio.create_task(directory.refresh())  # reads, then waits at the gate
        await asyncio.sleep(0.05)
        await here.revoke(key.id)
        seen = asyncio.create_task(directory.refresh_from_now())
        await asyncio.sleep(0.05)
        gated.gate.set()
        await stale
        await seen
        found = directory.lookup(_digest(plain))
        assert found is not None and found.revoked_at is not None
    finally:
        await directory.stop()
