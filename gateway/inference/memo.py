"""What is made of an object, kept while that very object is in use: a coding agent's
tool list is parsed once and shared (`gateway.api.tool_lists`), so what each request
derives from it (its JSON for the upstream, its token estimate) can be made once too.

Kept by the object's identity, not its value: a tuple of tools with their schemas is
not hashable, and comparing it would cost what making the value costs. An entry holds
its object, so no other object can take its `id` while the entry lives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

# Objects kept at most, per memo: the shared tool lists are bounded the same way.
MAX_ENTRIES = 64


class IdentityMemo(Generic[K, V]):
    """`make(key)`, made once per key object while it stays among the latest used."""

    __slots__ = ("_entries", "_make", "_size")

    def __init__(self, make: Callable[[K], V], entries: int = MAX_ENTRIES) -> None:
        self._make = make
        self._entries: dict[int, tuple[K, V]] = {}
        self._size = entries

    def __call__(self, key: K) -> V:
        entry = self._entries.get(id(key))
        if entry is not None and entry[0] is key:
            return entry[1]
        value = self._make(key)
        if len(self._entries) >= self._size:
            del self._entries[next(iter(self._entries))]  # the oldest made
        self._entries[id(key)] = (key, value)
        return value
