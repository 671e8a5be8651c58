"""MCP client sessions (the 2025-11-25 handshake era) and their events, in Redis: any
gateway serves any request of a session, and a restart of every gateway loses none.

A session is a hash under a random 128-bit id: the tenant and the key that made it (a
request of another key, of the same tenant or not, finds no session: 404 as an unknown
one), its protocol version and client, refreshed to `session_idle_s` by each use. What a
session's stream (GET) carries (the list-changed notifications of its tenant's servers)
is a Redis Stream per tenant, capped at `events_kept`: an event's id is its stream id,
so a client that comes back with `Last-Event-ID`, to any gateway, gets what followed.
"""

from __future__ import annotations

import re
import secrets
import time
from dataclasses import dataclass
from typing import Any

from gateway.storage.redis_client import RedisClient
from gateway.storage.redis_keys import hash_tag

SESSION_ID_BYTES = 16
# A session found in Redis is taken as alive for this long without asking again (and its
# idle time restarted at most this often): a tool call asks Redis for its session once a
# second, not every time. The cost: a session ended on another gateway is still served
# here for up to this long.
RECHECK_S = 1.0
# Sessions remembered in a process, at most.
MAX_REMEMBERED = 100_000
# An event id as Redis makes them: milliseconds, a dash, a sequence number, each below
# 2**64; and below the largest id, which no event can follow.
_EVENT_ID = re.compile(r"(\d{1,20})-(\d{1,20})")
_ID_PART_LIMIT = 2**64 - 1


@dataclass(frozen=True, slots=True)
class ClientSession:
    """What a session is bound to and what it agreed."""

    id: str
    tenant: str
    key_id: str
    protocol_version: str
    client: str


@dataclass(frozen=True, slots=True)
class Event:
    """A list change of `server`'s `kind` (tools, resources, prompts), under its id."""

    id: str
    server: str
    kind: str


class TooManySessions(Exception):
    """The tenant holds as many live sessions as it may."""


class SessionStore:
    """Sessions and the tenants' event streams in Redis."""

    def __init__(
        self,
        redis: RedisClient,
        prefix: str,
        idle_s: float,
        events_kept: int,
        max_per_tenant: int = 1000,
    ) -> None:
        self._redis = redis
        self._prefix = prefix
        self._idle_ms = int(idle_s * 1000)
        self._kept = events_kept
        self._max_per_tenant = max_per_tenant
        # Session id -> the session and when Redis last said it was alive.
        self._known: dict[str, tuple[ClientSession, float]] = {}

    def _session_key(self, session_id: str) -> str:
        return f"{self._prefix}:mcp:session:{session_id}"

    def _events_key(self, tenant: str) -> str:
        return f"{self._prefix}:{{{hash_tag(tenant)}}}:mcp:events"

    def _live_key(self, tenant: str) -> str:
        # The tenant's live sessions, each scored by when it expires.
        return f"{self._prefix}:{{{hash_tag(tenant)}}}:mcp:sessions"

    async def create(self, tenant: str, key_id: str, version: str, client: str) -> ClientSession:
        """A new session of `tenant`'s key `key_id`; `TooManySessions` past the tenant's
        live sessions (counted in Redis, across gateways; an expired one gives its room
        back)."""
        live = self._live_key(tenant)
        now_ms = int(time.time() * 1000)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.zremrangebyscore(live, "-inf", now_ms)
            pipe.zcard(live)
            _, count = await pipe.execute()
        if count >= self._max_per_tenant:
            raise TooManySessions
        session = ClientSession(
            secrets.token_hex(SESSION_ID_BYTES), tenant, key_id, version, client[:200]
        )
        await self._redis.zadd(live, {session.id: now_ms + self._idle_ms})
        await self._redis.pexpire(live, self._idle_ms)
        key = self._session_key(session.id)
        fields = ["tenant", tenant, "key_id", key_id, "version", version, "client", session.client]
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hset(key, items=fields)
            pipe.pexpire(key, self._idle_ms)
            await pipe.execute()
        return session

    async def find(self, session_id: str, tenant: str, key_id: str) -> ClientSession | None:
        """The session `session_id` if it is this key's and alive (its idle time
        restarted), else None: another key's session is not told apart from none."""
        known = self._known.get(session_id)
        if known is not None and time.monotonic() - known[1] < RECHECK_S:
            session = known[0]
            return session if (session.tenant, session.key_id) == (tenant, key_id) else None
        if len(session_id) != 2 * SESSION_ID_BYTES or not _is_hex(session_id):
            return None
        key = self._session_key(session_id)
        found = await self._redis.hgetall(key)
        values = {_text(k): _text(v) for k, v in (found or {}).items()}
        if "tenant" not in values:
            self._known.pop(session_id, None)
            return None
        session = ClientSession(
            session_id,
            values["tenant"],
            values.get("key_id", ""),
            values.get("version", ""),
            values.get("client", ""),
        )
        if len(self._known) >= MAX_REMEMBERED:
            self._known.clear()
        self._known[session_id] = (session, time.monotonic())
        if (session.tenant, session.key_id) != (tenant, key_id):
            return None  # another key's: not kept alive by it either
        live = self._live_key(tenant)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.pexpire(key, self._idle_ms)
            pipe.zadd(live, {session_id: int(time.time() * 1000) + self._idle_ms})
            pipe.pexpire(live, self._idle_ms)
            await pipe.execute()
        return session

    async def end(self, session: ClientSession) -> None:
        """The session is over (DELETE)."""
        self._known.pop(session.id, None)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.delete(self._session_key(session.id))
            pipe.zrem(self._live_key(session.tenant), session.id)
            await pipe.execute()

    async def publish(self, tenant: str, server: str, kind: str) -> None:
        """An event for every session of `tenant`: `server`'s `kind` listing changed."""
        await self._redis.xadd(
            self._events_key(tenant),
            {"server": server, "kind": kind},
            maxlen=self._kept,
            approximate=False,
        )

    async def last_event_id(self, tenant: str) -> str:
        """The id of `tenant`'s newest event ("0-0" for none): a new stream starts after it."""
        newest = await self._redis.xrevrange(self._events_key(tenant), count=1)
        return _text(newest[0][0]) if newest else "0-0"

    async def events_after(self, tenant: str, after: str, count: int = 100) -> list[Event]:
        """`tenant`'s events after the id `after` (a client's `Last-Event-ID`: one that is
        not a stream id reads as the start), oldest first."""
        if not _is_event_id(after):
            after = "0-0"
        found = await self._redis.xrange(self._events_key(tenant), min=f"({after}", count=count)
        events = []
        for event_id, fields in found or []:
            values = {_text(k): _text(v) for k, v in (fields or {}).items()}
            events.append(Event(_text(event_id), values.get("server", ""), values.get("kind", "")))
        return events


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _is_event_id(text: str) -> bool:
    found = _EVENT_ID.fullmatch(text)
    if found is None:
        return False
    first, second = int(found.group(1)), int(found.group(2))
    return (
        first <= _ID_PART_LIMIT
        and second <= _ID_PART_LIMIT
        and (first, second)
        != (
            _ID_PART_LIMIT,
            _ID_PART_LIMIT,
        )
    )


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)
