"""How long to wait before each retry of an upstream call."""

from __future__ import annotations

import random

from retry.policy import RetryPolicy


def backoff_delays(policy: RetryPolicy, rng: random.Random | None = None) -> list[float]:
    """The delay before each retry: ``max_attempts - 1`` of them.

    Retry ``k`` (0-based) waits ``min(max_delay_s, base_delay_s * 2**k)`` seconds.
    With ``policy.jitter`` each of those delays ``d`` becomes ``rng.uniform(0, d)``
    ("full jitter"), drawn in order; a fresh ``random.Random()`` is used if ``rng``
    is None.
    """
    delays = [
        min(policy.max_delay_s, policy.base_delay_s * 2**k) for k in range(policy.max_attempts - 1)
    ]
    if not policy.jitter:
        return delays
    source = rng if rng is not None else random.Random()
    return [source.uniform(0.0, delay) for delay in delays]
