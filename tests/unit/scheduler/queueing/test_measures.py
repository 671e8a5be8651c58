"""gateway_control.scheduler.queueing.measures: percentiles and the timeline."""

from __future__ import annotations

import math

import pytest

from gateway_control.scheduler.queueing.measures import Timeline, percentile


def test_percentile_interpolates() -> None:
    assert percentile([4, 1, 3, 2], 50) == 2.5
    assert percentile([1, 2, 3, 4], 95) == pytest.approx(3.85)
    assert math.isnan(percentile([], 50))


def test_timeline_means_and_buckets() -> None:
    timeline = Timeline()
    timeline.record(0, (100.0,))
    timeline.record(10, (0.0,))
    assert timeline.means(0, 40) == (25.0,)
    assert timeline.buckets(0, 40, 4) == [(0, (100.0,)), (10, (0.0,)), (20, (0.0,)), (30, (0.0,))]
    assert timeline.buckets(5, 15, 1) == [(5, (50.0,))]
