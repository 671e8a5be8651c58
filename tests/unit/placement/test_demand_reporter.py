"""What one gateway reports of its demand: the TTFT p95 of the last interval from the
histogram's buckets, erring high, and nothing for a model without first tokens."""

from __future__ import annotations

import math

from gateway_control.placement.demand_reporter import BucketCounts, TtftWindow


def test_the_p95_is_the_bound_of_its_bucket_over_the_last_interval_only() -> None:
    reads: list[dict[str, BucketCounts]] = [
        {"llm": {0.1: 90, 0.5: 100, 1.0: 100, math.inf: 100}},
        # 100 more first tokens, of which 10 under 0.1 s and 95 under 1 s.
        {"llm": {0.1: 100, 0.5: 150, 1.0: 195, math.inf: 200}, "idle": {math.inf: 0}},
        {"llm": {0.1: 100, 0.5: 150, 1.0: 195, math.inf: 200}},
        {"llm": {0.1: 100, 0.5: 150, 1.0: 195, math.inf: 220}},  # 20 past every bound
    ]
    window = TtftWindow(lambda: reads.pop(0))
    assert window.p95() == {"llm": 0.5}  # 90 of 100 within 0.1 s is not 95: the next is
    assert window.p95() == {"llm": 1.0}
    assert window.p95() == {}  # no first token in the interval: nothing measured
    assert window.p95() == {"llm": 1.0}  # the +Inf bucket: the largest finite bound
