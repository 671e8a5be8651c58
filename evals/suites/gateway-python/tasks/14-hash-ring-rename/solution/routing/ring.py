"""A consistent hashing ring that maps session ids to replicas."""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable


def _hash(text: str) -> int:
    digest = hashlib.md5(text.encode("utf-8"), usedforsecurity=False).digest()
    return int.from_bytes(digest[:8], "big")


class HashRing:
    """Each node owns ``vnodes`` points on a 64-bit ring; a key belongs to the node
    owning the first point clockwise from the key's hash."""

    def __init__(self, nodes: Iterable[str] = (), vnodes: int = 64) -> None:
        if vnodes < 1:
            raise ValueError("vnodes must be at least 1")
        self.vnodes = vnodes
        self._points: list[int] = []
        self._owners: dict[int, str] = {}
        for node in nodes:
            self.add_node(node)

    def add_node(self, node: str) -> None:
        if node in self._owners.values():
            return
        for i in range(self.vnodes):
            point = _hash(f"{node}#{i}")
            self._owners[point] = node
            bisect.insort(self._points, point)

    def remove_node(self, node: str) -> None:
        self._points = [p for p in self._points if self._owners[p] != node]
        self._owners = {p: n for p, n in self._owners.items() if n != node}

    def nodes(self) -> list[str]:
        return sorted(set(self._owners.values()))

    def node_for(self, key: str) -> str:
        """The node that owns ``key``. Raises LookupError on an empty ring."""
        if not self._points:
            raise LookupError("hash ring has no nodes")
        index = bisect.bisect_right(self._points, _hash(key)) % len(self._points)
        return self._owners[self._points[index]]
