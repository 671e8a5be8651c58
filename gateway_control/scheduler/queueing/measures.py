"""Measures of a queueing replay: percentiles and time-weighted series. Pure."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between closest ranks
    (NumPy's default); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def wait_summary(waits: Sequence[float]) -> dict[str, Any]:
    """Count, P50, P95, mean and max of queueing times (seconds, rounded to 0.1)."""
    if not waits:
        return {"jobs": 0, "p50_s": None, "p95_s": None, "mean_s": None, "max_s": None}
    return {
        "jobs": len(waits),
        "p50_s": round(percentile(waits, 50), 1),
        "p95_s": round(percentile(waits, 95), 1),
        "mean_s": round(sum(waits) / len(waits), 1),
        "max_s": round(max(waits), 1),
    }


SERIES = ("allocated_gpu_pct", "fragmented_gpu_pct", "down_gpu_pct", "pending_jobs")


@dataclass(slots=True)
class Timeline:
    """Piecewise-constant signals (the names in SERIES), recorded at each change."""

    times: list[float] = field(default_factory=list)
    values: list[tuple[float, ...]] = field(default_factory=list)

    def record(self, time: float, values: tuple[float, ...]) -> None:
        """The signals hold `values` from `time` on (a record at the same time replaces)."""
        if self.times and self.times[-1] == time:
            self.values[-1] = values
        elif not self.values or self.values[-1] != values:
            self.times.append(time)
            self.values.append(values)

    def means(self, start: float, end: float) -> tuple[float, ...]:
        """Time-weighted mean of each signal over [start, end]."""
        return self.buckets(start, end, 1)[0][1]

    def buckets(
        self, start: float, end: float, count: int
    ) -> list[tuple[float, tuple[float, ...]]]:
        """`count` equal slices of [start, end]: (slice start, time-weighted mean of each
        signal in it). Before the first record every signal is 0."""
        width = (end - start) / count if end > start else 0.0
        dims = len(self.values[0]) if self.values else len(SERIES)
        out = []
        index = 0  # first record after the slice start
        for b in range(count):
            lo = start + b * width
            hi = end if b == count - 1 else lo + width
            while index < len(self.times) and self.times[index] <= lo:
                index += 1
            current = self.values[index - 1] if index else (0.0,) * dims
            if hi <= lo:
                out.append((lo, current))
                continue
            sums = [0.0] * dims
            at = lo
            i = index
            while i < len(self.times) and self.times[i] < hi:
                for d in range(dims):
                    sums[d] += current[d] * (self.times[i] - at)
                at = self.times[i]
                current = self.values[i]
                i += 1
            for d in range(dims):
                sums[d] += current[d] * (hi - at)
            out.append((lo, tuple(s / (hi - lo) for s in sums)))
        return out
