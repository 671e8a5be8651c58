"""How fast a model's queue drains: completions per second while the model is saturated.

Only completions while every slot is taken measure the drain rate; below that they measure
demand (a model with 64 slots and 2 requests in flight completes 2 at a time, not 64), so
they are not counted, and the clock only runs while saturated.
"""

from __future__ import annotations

# No real interval is this short; it keeps the rate finite when completions share a tick.
_MIN_INTERVAL_S = 1e-9


class DrainMeter:
    """An EWMA of the seconds between completions of a saturated model.

    The EWMA weighs the last `window` completions most (alpha = 2 / (window + 1)). While
    saturated, the time since the last completion counts as a lower bound on the
    interval, so a model whose requests hang is seen to drain ever more slowly instead of
    keeping its last good rate.
    """

    __slots__ = ("_alpha", "_interval", "_since")

    def __init__(self, window: int = 32) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, not {window}")
        self._alpha = 2.0 / (window + 1)
        self._interval: float | None = None  # EWMA of seconds between completions
        self._since: float | None = None  # start of the running interval; None: not saturated

    def completed(self, now: float) -> None:
        """A request ended at `now`; it counts if the model was saturated until then."""
        if self._since is None:
            return
        sample = now - self._since
        if self._interval is None:
            self._interval = sample
        else:
            self._interval += self._alpha * (sample - self._interval)
        self._since = now

    def saturation(self, now: float, saturated: bool) -> None:
        """Whether every slot is taken as of `now`; the meter's clock runs only while so."""
        if not saturated:
            self._since = None
        elif self._since is None:
            self._since = now

    def rate(self, now: float) -> float | None:
        """Completions per second, or None before the first saturated completion."""
        if self._interval is None:
            return None
        interval = self._interval
        if self._since is not None:
            interval = max(interval, now - self._since)
        return 1.0 / max(interval, _MIN_INTERVAL_S)
