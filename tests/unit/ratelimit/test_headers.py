"""The `x-ratelimit-*` headers in the formats OpenAI's clients parse."""

from __future__ import annotations

import pytest

from gateway.ratelimit.headers import bucket_headers, duration


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0ms"),
        (0.2, "1ms"),  # rounded up: never reported shorter than it is
        (20, "20ms"),
        (999.5, "1s"),
        (1000, "1s"),
        (1500, "1.5s"),
        (1234.5, "1.235s"),
        (59_999.6, "1m0s"),
        (360_000, "6m0s"),
        (3_600_000, "1h0m0s"),
        (3_723_000, "1h2m3s"),
    ],
)
def test_reset_durations_are_in_openai_format(ms: float, text: str) -> None:
    assert duration(ms) == text


def test_bucket_headers_name_the_kind_and_never_go_negative() -> None:
    assert bucket_headers("tokens", 40_000, -12.5, 360_000) == {
        "x-ratelimit-limit-tokens": "40000",
        "x-ratelimit-remaining-tokens": "0",
        "x-ratelimit-reset-tokens": "6m0s",
    }
