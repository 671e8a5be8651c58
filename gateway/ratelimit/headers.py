"""OpenAI's `x-ratelimit-*` response headers."""

from __future__ import annotations


def duration(ms: float) -> str:
    """A reset time in OpenAI's format: `20ms`, `1s`, `1.5s`, `6m0s`, `1h2m3s`."""
    if ms < 1000:
        return f"{max(0, int(ms + 0.999))}ms"
    seconds = ms / 1000
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{secs:.3f}".rstrip("0").rstrip(".") + "s"
    if hours >= 1:
        return f"{int(hours)}h{int(minutes)}m{text}"
    if minutes >= 1:
        return f"{int(minutes)}m{text}"
    return text


def bucket_headers(kind: str, limit: int, remaining: float, reset_ms: float) -> dict[str, str]:
    """The three headers of one bucket; `kind` is `requests` or `tokens`."""
    return {
        f"x-ratelimit-limit-{kind}": str(limit),
        f"x-ratelimit-remaining-{kind}": str(max(0, int(remaining))),
        f"x-ratelimit-reset-{kind}": duration(reset_ms),
    }
