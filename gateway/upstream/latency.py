"""What a model usually takes: time to first token and time per token, as moving averages.

Used to predict whether a request can meet its deadline before sending it anywhere.
"""

from __future__ import annotations

# Weight of the newest observation: about the last 10 requests dominate.
_ALPHA = 0.2


class LatencyTracker:
    """Exponentially weighted averages of one model's TTFT and per-token time."""

    __slots__ = ("per_token_s", "ttft_s")

    def __init__(self) -> None:
        self.ttft_s: float | None = None
        self.per_token_s: float | None = None

    def observe(self, ttft_s: float | None, total_s: float, tokens: int) -> None:
        """Record a finished request: its first-token time (None when not streamed), its
        whole time and its output tokens."""
        if ttft_s is not None:
            self.ttft_s = _ewma(self.ttft_s, ttft_s)
        first = ttft_s if ttft_s is not None else (self.ttft_s or 0.0)
        if tokens > 1:
            per_token = max(0.0, total_s - first) / (tokens - 1)
            self.per_token_s = _ewma(self.per_token_s, per_token)

    def expected_s(self, stream: bool, max_tokens: int) -> float:
        """The usual wait for the first token (streams) or the whole answer (otherwise);
        0 while nothing has been observed."""
        ttft = self.ttft_s or 0.0
        if stream:
            return ttft
        return ttft + (self.per_token_s or 0.0) * max(0, max_tokens - 1)


def _ewma(current: float | None, value: float) -> float:
    return value if current is None else current + _ALPHA * (value - current)
