"""OpenAI's `x-ratelimit-*` response headers."""

from __future__ import annotations

import math


def duration(ms: float) -> str:
    """A reset time in OpenAI's format: `20ms`, `1s`, `1.5s`, `6m0s`, `1h2m3s`.

    Rounded up to a whole ms, so a wait is never reported shorter than it is.
    """
    whole = max(0, math.ceil(ms))
    if whole < 1000:
        return f"{whole}ms"
    hours, rest = divmod(whole, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds = f"{rest / 1000:.3f}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{seconds}"
    if minutes:
        return f"{minutes}m{seconds}"
    return seconds


def bucket_headers(kind: str, limit: int, remaining: float, reset_ms: float) -> dict[str, str]:
    """The three headers of one bucket; `kind` is `requests` or `tokens`."""
    return {
        f"x-ratelimit-limit-{kind}": str(limit),
        f"x-ratelimit-remaining-{kind}": str(max(0, int(remaining))),
        f"x-ratelimit-reset-{kind}": duration(reset_ms),
    }


# The names of `bucket_headers`, by kind.
HEADER_NAMES: dict[str, tuple[str, str, str]] = {
    kind: (
        f"x-ratelimit-limit-{kind}",
        f"x-ratelimit-remaining-{kind}",
        f"x-ratelimit-reset-{kind}",
    )
    for kind in ("requests", "tokens")
}
# `duration` of each wait under a second, made once: most waits are.
MS_TEXT = [duration(ms) for ms in range(1000)]
