"""A retry budget per model: retries may be at most a fraction of recent requests.

Like Finagle's RetryBudget (and Envoy's retry budgets): over the last `window_s`
seconds, the retries allowed are

    max(min_per_s * window_s, ratio * requests) - retries already made

so a few failing replicas get their requests retried, while a fleet-wide failure, where
every attempt fails, adds at most `ratio` more load instead of multiplying it by
`max_attempts` (a retry storm). The floor keeps retries possible at low traffic.

Counts live in one-second slots of a ring, with running totals: every call is O(1)
amortized, however many requests the window holds. A count leaves the window between
`window_s - 1` and `window_s` seconds after it was made (the slot resolution).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

# Width of one slot of the ring, in seconds of the clock.
SLOT_S = 1.0
# Slack for float error, so e.g. ratio 0.1 of 30 requests allows 3 retries, not 2.
_EPSILON = 1e-9


class RetryBudget:
    """The retry budget of one model. Not thread-safe: one event loop uses it.

    Call `record_request()` once per client request (not per attempt: retries must not
    grow their own budget), and `try_spend()` before each retry.
    """

    __slots__ = (
        "_clock",
        "_floor",
        "_ratio",
        "_requests",
        "_retries",
        "_slot",
        "_total_requests",
        "_total_retries",
    )

    def __init__(
        self,
        ratio: float,
        min_per_s: float,
        window_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # Written as positive checks so NaN fails them too.
        if not (0 <= ratio < math.inf):
            raise ValueError(f"retry budget ratio must be >= 0, not {ratio}")
        if not (0 <= min_per_s < math.inf):
            raise ValueError(f"retry budget min_per_s must be >= 0, not {min_per_s}")
        if not (0 < window_s < math.inf):
            raise ValueError(f"retry budget window_s must be positive, not {window_s}")
        self._ratio = ratio
        self._floor = min_per_s * window_s
        self._clock = clock
        slots = max(1, math.ceil(window_s / SLOT_S))
        self._requests = [0] * slots
        self._retries = [0] * slots
        self._total_requests = 0
        self._total_retries = 0
        # The absolute index (clock // SLOT_S) of the newest slot.
        self._slot = self._slot_at(clock())

    @staticmethod
    def _slot_at(now: float) -> int:
        return math.floor(now / SLOT_S)

    def _advance(self) -> int:
        """Drop the slots that left the window; the ring index of the current slot."""
        slot = self._slot_at(self._clock())
        size = len(self._requests)
        # A clock that went back counts into the newest slot rather than reopening old ones.
        if slot > self._slot:
            for step in range(1, min(slot - self._slot, size) + 1):
                index = (self._slot + step) % size
                self._total_requests -= self._requests[index]
                self._total_retries -= self._retries[index]
                self._requests[index] = 0
                self._retries[index] = 0
            self._slot = slot
        return self._slot % size

    def _limit(self) -> float:
        return max(self._floor, self._ratio * self._total_requests)

    def record_request(self) -> None:
        """Count a client request: it earns `ratio` retries for the window."""
        index = self._advance()
        self._requests[index] += 1
        self._total_requests += 1

    def try_spend(self) -> bool:
        """Take one retry from the budget: True (and counted) if it allows one, else False."""
        index = self._advance()
        if self._total_retries + 1 > self._limit() + _EPSILON:
            return False
        self._retries[index] += 1
        self._total_retries += 1
        return True

    def remaining(self) -> int:
        """How many retries the budget allows now (for metrics and tests)."""
        self._advance()
        return max(0, math.floor(self._limit() + _EPSILON) - self._total_retries)
