"""Sticky routing: a session keeps its replica while that replica is healthy."""

from __future__ import annotations

from collections.abc import Collection

from routing.ring import HashRing


class StickyRouter:
    def __init__(self, ring: HashRing) -> None:
        self.ring = ring

    def route(self, session_id: str, healthy: Collection[str]) -> str:
        """The session's own node if healthy, else its node on a ring of the healthy ones.

        Raises LookupError when no node of the ring is healthy.
        """
        node = self.ring.node_for(session_id)
        if node in healthy:
            return node
        survivors = [n for n in self.ring.nodes() if n in healthy]
        return HashRing(survivors, self.ring.vnodes).node_for(session_id)
