"""The drain meter: completions per second, measured only while the model is saturated."""

from __future__ import annotations

import pytest

from gateway.admission.drain import DrainMeter


def test_the_drain_meter_counts_only_saturated_time() -> None:
    meter = DrainMeter(window=4)
    meter.saturation(0.0, False)
    meter.completed(1.0)  # not saturated: demand, not capacity
    assert meter.rate(1.0) is None
    meter.saturation(2.0, True)
    meter.completed(2.5)
    assert meter.rate(2.5) == pytest.approx(2.0)
    meter.saturation(2.5, False)
    assert meter.rate(100.0) == pytest.approx(2.0)  # idle time is not a stall
    with pytest.raises(ValueError):
        DrainMeter(window=0)
