"""Callers refused by a request rate that caps all they send, until the wait ends.

A tenant (or a managed key) past its requests per minute is refused whatever it sends
next, until its bucket has room again. Remembering that here lets the conductor refuse
its next requests before it reads their bodies: without it, a tenant at its limit still
made the gateway read, parse and plan a 1 MB body for each 429 (50 ms of the event loop
each; another tenant's answers went from 17 ms to 700). Each gateway learns it from its
own refusals: nothing is asked of Redis for it.
"""

from __future__ import annotations

import dataclasses
import time

from gateway.ratelimit.decisions import Decision
from gateway.serving.auth import Identity

# Callers remembered at most (the oldest go first): each is a tenant or a managed key.
MAX_REMEMBERED = 65_536


class RefusedCallers:
    """Who is refused until when, by which decision."""

    def __init__(self) -> None:
        self._until: dict[tuple[str, str], tuple[float, Decision]] = {}

    def remember(self, identity: Identity, decision: Decision) -> None:
        """`decision` refused `identity`'s request: if it refuses all the caller sends
        for a while, refuse them without reading them until then."""
        if not decision.every_request or not decision.retry_after_s:
            return
        if len(self._until) >= MAX_REMEMBERED:
            del self._until[next(iter(self._until))]
        until = time.monotonic() + decision.retry_after_s
        self._until[(identity.name, identity.key_id)] = (until, decision)

    def refusal(self, identity: Identity) -> Decision | None:
        """The decision that refuses `identity` now, its wait counted from now; None when
        it is not refused (or no longer)."""
        if not self._until:
            return None
        found = self._until.get((identity.name, identity.key_id))
        if found is None:
            return None
        until, decision = found
        left = until - time.monotonic()
        if left <= 0:
            del self._until[(identity.name, identity.key_id)]
            return None
        return dataclasses.replace(decision, retry_after_s=left, reservation=None)
