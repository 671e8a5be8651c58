"""Per-conversation state kept between the requests of a session."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from cache.ttl import TTLCache


@dataclass
class Session:
    session_id: str
    tenant: str
    replica: str | None = None
    turns: list[str] = field(default_factory=list)


class SessionStore:
    """Sessions expire ``ttl_s`` seconds after they were last saved (``create``/``save``)."""

    def __init__(self, ttl_s: float) -> None:
        self._ids = itertools.count(1)
        self._cache: TTLCache[str, Session] = TTLCache(ttl_s, max_entries=10_000)

    def create(self, tenant: str) -> Session:
        session = Session(session_id=f"sess_{next(self._ids):08d}", tenant=tenant)
        self._cache.put(session.session_id, session)
        return session

    def get(self, session_id: str, tenant: str) -> Session | None:
        """The session if it exists, has not expired and belongs to ``tenant``."""
        session = self._cache.get(session_id)
        if session is None or session.tenant != tenant:
            return None
        return session

    def save(self, session: Session) -> None:
        self._cache.put(session.session_id, session)

    def active_count(self) -> int:
        return len(self._cache)
