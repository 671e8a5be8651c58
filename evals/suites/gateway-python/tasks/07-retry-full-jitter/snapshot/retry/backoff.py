"""How long to wait before each retry of an upstream call."""

from __future__ import annotations

from retry.policy import RetryPolicy


def backoff_delays(policy: RetryPolicy) -> list[float]:
    """The delay before each retry: ``max_attempts - 1`` of them.

    Retry ``k`` (0-based) waits ``min(max_delay_s, base_delay_s * 2**k)`` seconds.
    """
    return [
        min(policy.max_delay_s, policy.base_delay_s * 2**k) for k in range(policy.max_attempts - 1)
    ]
