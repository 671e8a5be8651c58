"""Choosing preemption victims. Pure: the caller supplies the state changes as callbacks.

Candidates come in preference order (jobs of borrowing tenants first, then the lowest
priority, then the youngest). They are taken greedily until the preemptor can run, then
the search gives back, least preferred first, every victim it turns out not to need
(Kueue's approach), so the set is minimal for that order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

V = TypeVar("V")


def victim_key(borrowing: bool, priority: int, start_order: int) -> tuple[int, int, int]:
    """Sort key, most preferred victim first: borrowing tenants' jobs, lowest priority,
    youngest (`start_order` grows with each start, so ties in start time are ordered)."""
    return (0 if borrowing else 1, priority, -start_order)


def select_victims(
    candidates: Iterable[V],
    eligible: Callable[[V], bool],
    take: Callable[[V], None],
    give_back: Callable[[V], None],
    satisfied: Callable[[], bool],
) -> list[V] | None:
    """Victims (taken, in preference order) that let the preemptor run, or None (with
    every trial taking undone) when all eligible candidates are not enough.

    `eligible(v)` is asked just before taking v (a reclaim victim's tenant must still be
    borrowing); `take` and `give_back` apply and undo v's removal; `satisfied()` says
    whether the preemptor can run in the current state.
    """
    taken: list[V] = []
    for victim in candidates:
        if not eligible(victim):
            continue
        take(victim)
        taken.append(victim)
        if satisfied():
            break
    else:
        for victim in reversed(taken):
            give_back(victim)
        return None
    # Minimise: the last victim was needed; try to spare the others, least preferred first.
    kept = [taken[-1]]
    for victim in reversed(taken[:-1]):
        give_back(victim)
        if satisfied():
            continue
        take(victim)
        kept.append(victim)
    kept.reverse()
    return kept
