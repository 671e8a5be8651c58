"""What is made of an object, kept on that very object: a coding agent's tool list is
parsed once and shared (`gateway.api.tool_lists`), so what each request derives from it
(its JSON for the upstream, its token estimate, its template JSON) can be made once too.

Kept on the object (in its `__dict__`), not in a table: it lives exactly as long as the
object, which the tool cache holds while the list is among its latest and each request
holds while it runs. A memo therefore holds nothing the gateway would not hold anyway:
a tenant sending a new megabyte of tools each time leaves nothing behind (a table of
the latest 64 lists, which held their objects, pinned a gigabyte). Not by value: a
tuple of tools with their schemas is not hashable, and comparing it would cost what
making the value costs. An object without a `__dict__` (a plain tuple) keeps nothing:
its value is made each time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class ObjectMemo(Generic[K, V]):
    """`make(key)`, made once per key object and kept on it under `name`."""

    __slots__ = ("_make", "_name")

    def __init__(self, name: str, make: Callable[[K], V]) -> None:
        self._name = f"_memo_{name}"
        self._make = make

    def __call__(self, key: K) -> V:
        kept = getattr(key, "__dict__", None)
        if kept is None:
            return self._make(key)
        try:
            value: V = kept[self._name]
        except KeyError:
            value = kept[self._name] = self._make(key)
        return value
