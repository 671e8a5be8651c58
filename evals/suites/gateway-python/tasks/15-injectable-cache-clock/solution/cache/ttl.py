"""A small cache whose entries expire a fixed time after they were stored."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class TTLCache(Generic[K, V]):
    """Entries live ``ttl_s`` seconds from their last ``put``.

    An entry stored at time ``t`` is visible while ``now < t + ttl_s`` and expired from
    ``t + ttl_s`` on. When a new key would exceed ``max_entries``, expired entries are
    dropped first, then the oldest-stored ones.
    """

    def __init__(
        self,
        ttl_s: float,
        max_entries: int = 1024,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ttl_s <= 0 or max_entries < 1:
            raise ValueError("ttl_s must be positive and max_entries at least 1")
        self._clock = clock
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._entries: dict[K, tuple[float, V]] = {}

    def put(self, key: K, value: V) -> None:
        now = self._clock()
        self._entries.pop(key, None)
        if len(self._entries) >= self.max_entries:
            self._purge(now)
        while len(self._entries) >= self.max_entries:
            del self._entries[next(iter(self._entries))]
        self._entries[key] = (now + self.ttl_s, value)

    def get(self, key: K) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        expires_at, value = entry
        if self._clock() >= expires_at:
            del self._entries[key]
            return None
        return value

    def _purge(self, now: float) -> None:
        for key in [k for k, (expires_at, _) in self._entries.items() if now >= expires_at]:
            del self._entries[key]

    def __len__(self) -> int:
        """Entries stored and not yet expired."""
        self._purge(self._clock())
        return len(self._entries)
