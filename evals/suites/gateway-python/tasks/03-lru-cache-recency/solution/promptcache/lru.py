"""A bounded least-recently-used cache for prompt-prefix lookups."""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class LRUCache(Generic[K, V]):
    """Maps keys to values and keeps at most ``capacity`` entries.

    When a new key would exceed the capacity, the least recently used entry is
    evicted. A ``get`` that finds its key and any ``put`` count as a use of that
    key; ``peek`` and ``in`` do not.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        """The value for ``key``, or None when it is not cached."""
        if key in self._entries:
            self.hits += 1
            self._entries.move_to_end(key)
            return self._entries[key]
        self.misses += 1
        return None

    def peek(self, key: K) -> V | None:
        """Like ``get`` but neither a use nor counted as a hit or miss."""
        return self._entries.get(key)

    def put(self, key: K, value: V) -> None:
        self._entries[key] = value
        self._entries.move_to_end(key)
        if len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def keys(self) -> list[K]:
        """Cached keys from least to most recently used."""
        return list(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)
