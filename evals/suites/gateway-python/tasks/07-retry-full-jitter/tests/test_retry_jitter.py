import random

import pytest

from retry.backoff import backoff_delays
from retry.policy import RetryPolicy


def test_without_jitter_schedule_is_unchanged() -> None:
    policy = RetryPolicy(max_attempts=6, base_delay_s=0.5, max_delay_s=4.0)
    assert policy.jitter is False
    expected = [0.5, 1.0, 2.0, 4.0, 4.0]
    assert backoff_delays(policy) == expected
    assert backoff_delays(policy, random.Random(1)) == expected


def test_jitter_from_config() -> None:
    policy = RetryPolicy.from_dict({"max_attempts": 4, "jitter": True})
    assert policy == RetryPolicy(max_attempts=4, jitter=True)
    assert RetryPolicy.from_dict({}).jitter is False
    assert RetryPolicy.from_dict({"jitter": False}).jitter is False


@pytest.mark.parametrize("value", ["yes", 1, 0, None])
def test_non_bool_jitter_is_rejected(value: object) -> None:
    with pytest.raises(ValueError):
        RetryPolicy.from_dict({"jitter": value})


def test_full_jitter_draws_uniform_in_schedule_order() -> None:
    policy = RetryPolicy(max_attempts=5, base_delay_s=1.0, max_delay_s=3.0, jitter=True)
    reference = random.Random(1234)
    expected = [reference.uniform(0, d) for d in (1.0, 2.0, 3.0, 3.0)]
    assert backoff_delays(policy, random.Random(1234)) == expected


def test_jittered_delays_stay_within_the_schedule() -> None:
    policy = RetryPolicy(max_attempts=8, base_delay_s=0.2, max_delay_s=2.0, jitter=True)
    plain = backoff_delays(RetryPolicy(max_attempts=8, base_delay_s=0.2, max_delay_s=2.0))
    rng = random.Random(99)
    for _ in range(50):
        delays = backoff_delays(policy, rng)
        assert len(delays) == 7
        assert all(0.0 <= got <= cap for got, cap in zip(delays, plain, strict=True))


def test_jitter_without_rng_still_works() -> None:
    policy = RetryPolicy(max_attempts=3, base_delay_s=1.0, max_delay_s=1.0, jitter=True)
    delays = backoff_delays(policy)
    assert len(delays) == 2
    assert all(0.0 <= d <= 1.0 for d in delays)
