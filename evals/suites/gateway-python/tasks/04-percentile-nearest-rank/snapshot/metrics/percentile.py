"""Percentiles of request latencies for the dashboard and the SLO report."""

from __future__ import annotations

import math
from collections.abc import Sequence

DEFAULT_PERCENTILES: tuple[float, ...] = (50.0, 90.0, 99.0, 100.0)


def percentile(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile of ``values`` by the nearest-rank method.

    With the ``n`` values sorted ascending, the result is the value at the 1-based
    rank ``ceil(p * n / 100)``, so it is always one of the samples and p100 is the
    maximum. ``p`` must satisfy ``0 < p <= 100``. Raises ValueError for an empty
    sequence or a ``p`` out of range.
    """
    if not values:
        raise ValueError("percentile of an empty sequence")
    if not 0 < p <= 100:
        raise ValueError(f"percentile out of range: {p}")
    ordered = sorted(values)
    rank = math.ceil(p * len(ordered) / 100)
    return ordered[rank]


def latency_summary(
    samples_ms: Sequence[float], percentiles: Sequence[float] = DEFAULT_PERCENTILES
) -> dict[str, float]:
    """Count, mean and the requested percentiles, keyed "count", "mean", "p50"...

    Percentile keys drop a trailing ".0" ("p99", but "p99.9"). An empty window
    gives ``{"count": 0}`` only.
    """
    if not samples_ms:
        return {"count": 0}
    summary: dict[str, float] = {
        "count": len(samples_ms),
        "mean": sum(samples_ms) / len(samples_ms),
    }
    for p in percentiles:
        label = f"p{p:g}"
        summary[label] = percentile(samples_ms, p)
    return summary
