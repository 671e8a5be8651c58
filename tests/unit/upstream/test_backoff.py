"""Backoff: pure logic, with a seeded rng."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.upstream.backoff import Backoff

# -- backoff ----------------------------------------------------------------------------


def test_ceiling_doubles_from_base_up_to_the_cap() -> None:
    backoff = Backoff(base_s=0.05, cap_s=1.0)
    assert [backoff.ceiling(a) for a in range(7)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    # No overflow however many attempts.
    assert backoff.ceiling(10_000) == 1.0


@given(seed=st.integers(0, 2**32), attempt=st.integers(0, 2000))
def test_delays_stay_within_zero_and_the_ceiling(seed: int, attempt: int) -> None:
    backoff = Backoff(base_s=0.05, cap_s=1.0, rng=random.Random(seed))
    assert 0.0 <= backoff.delay(attempt) <= backoff.ceiling(attempt)


def test_full_jitter_is_uniform_below_the_ceiling() -> None:
    backoff = Backoff(base_s=0.1, cap_s=10.0, rng=random.Random(7))
    ceiling = backoff.ceiling(3)  # 0.8
    samples = [backoff.delay(3) for _ in range(5000)]
    assert sum(samples) / len(samples) == pytest.approx(ceiling / 2, rel=0.03)
    # Each tenth of [0, ceiling] gets about a tenth of the draws (not "equal jitter",
    # which never goes below half the ceiling).
    counts = [0] * 10
    for s in samples:
        counts[min(9, int(s / ceiling * 10))] += 1
    assert all(400 <= c <= 600 for c in counts), counts
    assert min(samples) < ceiling * 0.01


def test_a_seeded_rng_makes_delays_reproducible() -> None:
    first = Backoff(0.05, 1.0, random.Random(42))
    second = Backoff(0.05, 1.0, random.Random(42))
    assert [first.delay(a) for a in range(10)] == [second.delay(a) for a in range(10)]


def test_backoff_rejects_bad_settings() -> None:
    with pytest.raises(ValueError):
        Backoff(base_s=-1.0, cap_s=1.0)
    with pytest.raises(ValueError):
        Backoff(base_s=0.1, cap_s=float("nan"))
    with pytest.raises(ValueError):
        Backoff(0.1, 1.0).delay(-1)
