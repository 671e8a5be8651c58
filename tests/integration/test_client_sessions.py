"""MCP client sessions and their events on a real redis-server
(gateway/mcp/client_sessions.py): a session is found only by the key that made it, a
malformed id finds nothing (and costs Redis nothing it could refuse), DELETE ends it; a
tenant's events come back in order after any id a client resumes from, a malformed one
read as the start, the stream capped at `events_kept`. Every test has its own prefix."""

from __future__ import annotations

import uuid

import pytest
from redis.asyncio import Redis

from gateway.mcp.client_sessions import (
    SESSION_ID_BYTES,
    ClientSession,
    SessionStore,
    TooManySessions,
)

IDLE_S = 600.0
KEPT = 5
VERSION = "2025-11-25"
CLIENT = "claude-code/2.1.0"


@pytest.fixture
def prefix() -> str:
    # The server lives for the whole session: every test gets keys of its own.
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def store(redis: Redis, prefix: str) -> SessionStore:
    return SessionStore(redis, prefix, IDLE_S, KEPT)


# --- sessions ----------------------------------------------------------------------------


async def test_a_new_session_is_found_by_its_key(store: SessionStore) -> None:
    session = await store.create("acme", "key-1", VERSION, CLIENT)
    assert len(session.id) == 2 * SESSION_ID_BYTES
    assert set(session.id) <= set("0123456789abcdef")
    assert session == ClientSession(session.id, "acme", "key-1", VERSION, CLIENT)
    assert await store.find(session.id, "acme", "key-1") == session


async def test_sessions_are_found_by_any_gateway(
    store: SessionStore, redis: Redis, prefix: str
) -> None:
    session = await store.create("acme", "key-1", VERSION, CLIENT)
    another_gateway = SessionStore(redis, prefix, IDLE_S, KEPT)
    assert await another_gateway.find(session.id, "acme", "key-1") == session


async def test_each_session_has_an_id_of_its_own(store: SessionStore) -> None:
    ids = {(await store.create("acme", "key-1", VERSION, CLIENT)).id for _ in range(20)}
    assert len(ids) == 20


async def test_a_session_s_idle_time_restarts_with_each_find(
    store: SessionStore, redis: Redis, prefix: str
) -> None:
    session = await store.create("acme", "key-1", VERSION, CLIENT)
    key = f"{prefix}:mcp:session:{session.id}"
    assert 0 < await redis.pttl(key) <= IDLE_S * 1000
    await redis.pexpire(key, 5000)
    assert await store.find(session.id, "acme", "key-1") == session
    assert await redis.pttl(key) > 5000


async def test_a_long_client_name_is_cut_to_200_characters(store: SessionStore) -> None:
    session = await store.create("acme", "key-1", VERSION, "c" * 1000)
    assert session.client == "c" * 200
    found = await store.find(session.id, "acme", "key-1")
    assert found is not None and found.client == "c" * 200


async def test_another_tenant_or_another_key_finds_no_session(store: SessionStore) -> None:
    session = await store.create("acme", "key-1", VERSION, CLIENT)
    assert await store.find(session.id, "beta", "key-1") is None
    assert await store.find(session.id, "acme", "key-2") is None
    assert await store.find(session.id, "beta", "key-2") is None
    # Looking did not end it for its own key.
    assert await store.find(session.id, "acme", "key-1") == session


async def test_an_unknown_session_is_none(store: SessionStore) -> None:
    assert await store.find("0" * 2 * SESSION_ID_BYTES, "acme", "key-1") is None


@pytest.mark.parametrize(
    "session_id",
    [
        "",
        "abc",
        "0" * (2 * SESSION_ID_BYTES - 1),
        "0" * (2 * SESSION_ID_BYTES + 1),
        "g" * (2 * SESSION_ID_BYTES),
        "../../../../../../../../../../ab",
        "*" * (2 * SESSION_ID_BYTES),
        "0123456789abcdef0123456789abcde\n",
        "0123456789ABCDEF0123456789ABCDEF",
        "0123456789abcdef" * 100,
    ],
)
async def test_a_malformed_session_id_finds_nothing(
    session_id: str, store: SessionStore, redis: Redis, prefix: str
) -> None:
    assert await store.find(session_id, "acme", "key-1") is None
    # Nothing was written for it.
    assert await redis.keys(f"{prefix}:*") == []


async def test_a_malformed_id_does_not_reach_an_existing_session(store: SessionStore) -> None:
    session = await store.create("acme", "key-1", VERSION, CLIENT)
    assert await store.find(session.id.upper(), "acme", "key-1") is None
    assert await store.find(session.id + "*", "acme", "key-1") is None
    assert await store.find(" " + session.id[1:], "acme", "key-1") is None


async def test_an_ended_session_is_not_found(store: SessionStore) -> None:
    session = await store.create("acme", "key-1", VERSION, CLIENT)
    other = await store.create("acme", "key-1", VERSION, CLIENT)
    await store.end(session)
    assert await store.find(session.id, "acme", "key-1") is None
    assert await store.find(other.id, "acme", "key-1") == other
    await store.end(session)  # again: nothing to end


# --- events ------------------------------------------------------------------------------


async def test_events_come_back_in_order_with_their_ids(store: SessionStore) -> None:
    await store.publish("acme", "github", "tools")
    await store.publish("acme", "docs", "resources")
    await store.publish("acme", "github", "prompts")
    events = await store.events_after("acme", "0-0")
    assert [(e.server, e.kind) for e in events] == [
        ("github", "tools"),
        ("docs", "resources"),
        ("github", "prompts"),
    ]
    ids = [e.id for e in events]
    assert len(set(ids)) == 3
    assert ids == sorted(ids, key=lambda i: tuple(int(part) for part in i.split("-")))
    assert all(part.isdigit() for i in ids for part in i.split("-"))


async def test_events_after_an_id_are_only_those_that_followed(store: SessionStore) -> None:
    for server in ("a", "b", "c", "d"):
        await store.publish("acme", server, "tools")
    first, second, *_ = await store.events_after("acme", "0-0")
    assert [e.server for e in await store.events_after("acme", first.id)] == ["b", "c", "d"]
    assert [e.server for e in await store.events_after("acme", second.id)] == ["c", "d"]
    last = (await store.events_after("acme", "0-0"))[-1]
    assert await store.events_after("acme", last.id) == []


async def test_events_after_count_at_most(store: SessionStore) -> None:
    for server in ("a", "b", "c"):
        await store.publish("acme", server, "tools")
    assert [e.server for e in await store.events_after("acme", "0-0", count=2)] == ["a", "b"]


async def test_a_tenant_sees_only_its_own_events(store: SessionStore) -> None:
    await store.publish("acme", "github", "tools")
    await store.publish("beta", "docs", "tools")
    assert [e.server for e in await store.events_after("acme", "0-0")] == ["github"]
    assert [e.server for e in await store.events_after("beta", "0-0")] == ["docs"]
    assert await store.events_after("gamma", "0-0") == []


@pytest.mark.parametrize(
    "after",
    [
        "",
        "latest",
        "1700000000000-0; FLUSHALL",
        "$",
        "+",
        "1" * 65,
        "-",
        "--",
        "0-",
        "-5",
        "1-2-3",
        "99999999999999999999-0",
    ],
)
async def test_a_malformed_last_event_id_is_read_as_the_start(
    after: str, store: SessionStore
) -> None:
    # A client's Last-Event-ID header, as it sent it.
    await store.publish("acme", "github", "tools")
    await store.publish("acme", "docs", "tools")
    events = await store.events_after("acme", after)
    assert [e.server for e in events] == ["github", "docs"]


async def test_the_stream_keeps_the_last_events_kept(store: SessionStore) -> None:
    for i in range(KEPT + 7):
        await store.publish("acme", f"s{i}", "tools")
    events = await store.events_after("acme", "0-0")
    assert [e.server for e in events] == [f"s{i}" for i in range(7, KEPT + 7)]


async def test_the_last_event_id_is_the_newest_or_0_0(store: SessionStore) -> None:
    assert await store.last_event_id("acme") == "0-0"
    await store.publish("acme", "github", "tools")
    await store.publish("acme", "docs", "tools")
    newest = await store.last_event_id("acme")
    assert newest == (await store.events_after("acme", "0-0"))[-1].id
    # A stream opened now starts after it.
    assert await store.events_after("acme", newest) == []
    await store.publish("acme", "files", "tools")
    assert [e.server for e in await store.events_after("acme", newest)] == ["files"]


async def test_another_key_does_not_keep_a_session_alive(
    store: SessionStore, redis: Redis, prefix: str
) -> None:
    session = await store.create("acme", "key-1", VERSION, CLIENT)
    key = f"{prefix}:mcp:session:{session.id}"
    await redis.pexpire(key, 5_000)
    assert await SessionStore(redis, prefix, IDLE_S, KEPT).find(session.id, "globex", "k") is None
    assert await redis.pttl(key) <= 5_000  # not restarted by the stranger's request
    assert await SessionStore(redis, prefix, IDLE_S, KEPT).find(session.id, "acme", "key-1")
    assert await redis.pttl(key) > 5_000  # restarted by its own key's


async def test_a_tenant_holds_at_most_its_live_sessions(redis: Redis, prefix: str) -> None:
    store = SessionStore(redis, prefix, IDLE_S, KEPT, max_per_tenant=2)
    first = await store.create("acme", "key-1", VERSION, CLIENT)
    await store.create("acme", "key-2", VERSION, CLIENT)
    with pytest.raises(TooManySessions):
        await store.create("acme", "key-1", VERSION, CLIENT)
    # Another tenant's count is its own; an ended session gives its room back.
    await store.create("globex", "key-9", VERSION, CLIENT)
    await store.end(first)
    assert await store.create("acme", "key-1", VERSION, CLIENT)


async def test_an_expired_session_gives_its_room_back(redis: Redis, prefix: str) -> None:
    store = SessionStore(redis, prefix, 60.0, KEPT, max_per_tenant=1)
    session = await store.create("acme", "key-1", VERSION, CLIENT)
    # As if its idle time had passed (its score is when it expires).
    await redis.zadd(f"{prefix}:{{acme}}:mcp:sessions", {session.id: 1})
    assert await store.create("acme", "key-1", VERSION, CLIENT)
