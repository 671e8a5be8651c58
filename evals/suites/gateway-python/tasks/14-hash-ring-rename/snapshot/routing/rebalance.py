"""What a change of replicas does to session placement."""

from __future__ import annotations

from collections.abc import Iterable

from routing.ring import HashRing


def moved_keys(
    before: HashRing, after: HashRing, keys: Iterable[str]
) -> dict[str, tuple[str, str]]:
    """The keys whose node differs between two rings, with their (old, new) nodes."""
    moved: dict[str, tuple[str, str]] = {}
    for key in keys:
        old, new = before.get_node(key), after.get_node(key)
        if old != new:
            moved[key] = (old, new)
    return moved
