"""A consistent-hash ring of a model's replicas: every gateway that knows the same
replica URLs builds the same ring, so a key has the same owner everywhere without the
gateways talking to each other.

Each replica takes `points` positions (the hash of its URL and an index). A key's owner
is the first replica clockwise from the key's position; the replicas after it, in ring
order, are where its requests go when the owner cannot take them. Adding or removing a
replica moves only the keys whose owner it is or becomes (about 1/n of them).
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Sequence


def position(data: bytes) -> int:
    """A 64-bit ring position for `data` (BLAKE2b: fast, and stable across processes,
    unlike Python's salted `hash`)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


class HashRing:
    """The ring of some replica URLs."""

    __slots__ = ("_order", "_owners", "_positions", "urls")

    def __init__(self, urls: Sequence[str], points: int) -> None:
        self.urls = tuple(urls)
        placed = sorted(
            (position(f"{url}#{index}".encode()), slot)
            for slot, url in enumerate(self.urls)
            for index in range(points)
        )
        self._positions = [p for p, _ in placed]
        self._owners = [slot for _, slot in placed]
        # From each point, the replicas in the order a key there meets them, worked out
        # on first use: walking point by point revisits replicas.
        self._order: dict[int, tuple[int, ...]] = {}

    def walk(self, key: int) -> tuple[int, ...]:
        """The replicas' indices (in `urls`) in the order `key` meets them: its owner first."""
        if not self._positions:
            return ()
        start = bisect.bisect_left(self._positions, key) % len(self._positions)
        order = self._order.get(start)
        if order is None:
            order = self._order[start] = self._meet(start)
        return order

    def _meet(self, start: int) -> tuple[int, ...]:
        seen: dict[int, None] = {}
        points = len(self._owners)
        for step in range(points):
            seen.setdefault(self._owners[(start + step) % points])
            if len(seen) == len(self.urls):
                break
        return tuple(seen)
