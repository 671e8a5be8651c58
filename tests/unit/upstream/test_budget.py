"""Retry budget: pure logic, with a fake clock."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.upstream.budget import RetryBudget
from tests.fake_clock import FakeClock

# -- retry budget -----------------------------------------------------------------------


def test_budget_allows_a_ratio_of_recent_requests() -> None:
    budget = RetryBudget(ratio=0.2, min_per_s=0.0, window_s=10.0, clock=FakeClock())
    for _ in range(100):
        budget.record_request()
    assert budget.remaining() == 20
    assert sum(budget.try_spend() for _ in range(50)) == 20
    assert budget.remaining() == 0
    # Each new request earns a fifth of a retry.
    for _ in range(5):
        budget.record_request()
    assert budget.try_spend()
    assert not budget.try_spend()


def test_budget_floor_allows_retries_without_traffic() -> None:
    budget = RetryBudget(ratio=0.2, min_per_s=1.0, window_s=10.0, clock=FakeClock())
    assert sum(budget.try_spend() for _ in range(20)) == 10
    # Fractions of a retry are not rounded up.
    budget = RetryBudget(ratio=0.1, min_per_s=0.0, window_s=10.0, clock=FakeClock())
    for _ in range(29):
        budget.record_request()
    assert sum(budget.try_spend() for _ in range(5)) == 2
    budget.record_request()
    assert budget.try_spend()


def test_budget_window_slides() -> None:
    clock = FakeClock(0.0)
    budget = RetryBudget(ratio=0.5, min_per_s=0.0, window_s=10.0, clock=clock)
    for _ in range(10):
        budget.record_request()
    assert sum(budget.try_spend() for _ in range(10)) == 5
    clock.advance(5)
    for _ in range(10):
        budget.record_request()
    # 20 requests in the window, 5 retries spent: 5 more.
    assert budget.remaining() == 5
    clock.advance(5)  # t=10: the first second's slot has left the window
    assert budget.remaining() == 5  # 10 requests, no retries left in the window
    clock.advance(5)  # t=15: everything is gone
    assert budget.remaining() == 0
    assert not budget.try_spend()
    # A long idle gap clears every slot.
    clock.advance(1000)
    budget.record_request()
    budget.record_request()
    assert budget.remaining() == 1


def test_budget_refuses_a_retry_storm() -> None:
    """Every replica failing: 1000 requests with 3 attempts each would be 2000 retries."""
    clock = FakeClock()
    budget = RetryBudget(ratio=0.2, min_per_s=1.0, window_s=10.0, clock=clock)
    retries = 0
    for i in range(1000):
        if i % 100 == 0:
            clock.advance(0.5)  # 200 requests/s for 5 s: all inside one window
        budget.record_request()
        for _ in range(2):
            if not budget.try_spend():
                break
            retries += 1
    assert retries == 200  # the ratio's share, not 2000
    assert retries <= 0.2 * 1000 + 10


def test_budget_survives_a_clock_going_back() -> None:
    clock = FakeClock(100.0)
    budget = RetryBudget(ratio=1.0, min_per_s=0.0, window_s=3.0, clock=clock)
    budget.record_request()
    clock.advance(-50)
    budget.record_request()
    assert budget.remaining() == 2


ops = st.lists(
    st.tuples(st.sampled_from(["request", "retry"]), st.floats(0, 4, allow_nan=False)),
    max_size=60,
)


@settings(max_examples=100)
@given(
    ops=ops,
    window_s=st.sampled_from([0.5, 1.0, 3.0, 7.5]),
    ratio=st.sampled_from([0.0, 0.1, 0.5, 2.0]),
    min_per_s=st.sampled_from([0.0, 0.3, 1.0]),
)
def test_budget_matches_a_list_of_timestamps(
    ops: list[tuple[str, float]], window_s: float, ratio: float, min_per_s: float
) -> None:
    """The slot ring decides as a plain list of (whole-second) timestamps would."""
    clock = FakeClock(0.0)
    budget = RetryBudget(ratio, min_per_s, window_s, clock)
    slots = max(1, -int(-window_s // 1))
    requests: deque[int] = deque()
    retries: deque[int] = deque()
    for op, gap in ops:
        clock.advance(gap)
        now_slot = int(clock.now // 1)
        for log in (requests, retries):
            while log and log[0] <= now_slot - slots:
                log.popleft()
        if op == "request":
            budget.record_request()
            requests.append(now_slot)
        else:
            allowed = len(retries) + 1 <= max(min_per_s * window_s, ratio * len(requests)) + 1e-9
            assert budget.try_spend() == allowed
            if allowed:
                retries.append(now_slot)


def test_budget_rejects_bad_settings() -> None:
    with pytest.raises(ValueError):
        RetryBudget(ratio=-0.1, min_per_s=1.0, window_s=10.0)
    with pytest.raises(ValueError):
        RetryBudget(ratio=0.2, min_per_s=1.0, window_s=0.0)
