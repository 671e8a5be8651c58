"""What a model's requests usually take, learned from the requests it serves.

Used to predict whether a request can meet its deadline before sending it anywhere.

The model, for a request of `p` prompt tokens and `n` output tokens:

    first token   ttft(p)     = ttft_s + prefill_s * p
    whole answer  total(p, n) = ttft(p) + per_token_s * (n - 1)

`ttft_s` is the wait for the first token of an empty prompt (queueing, scheduling, a
first step), `prefill_s` the time per prompt token, `per_token_s` the time per output
token after the first (decode). A request's prediction uses its own prompt size: a
100,000-token prompt is predicted to take its prefill, a chat question is not.

How a finished request teaches the model (O(1), no locks: one event loop owns it):

- a stream's first-token time: its error against `ttft(p)` is shared between `ttft_s`
  and `prefill_s` by normalised least mean squares over the request's features
  `(1, p / PROMPT_SCALE)`: a short prompt's time teaches the base, a long prompt's the
  prefill rate;
- the rest of a stream: `per_token_s` from `(total - ttft) / (n - 1)`, measured apart
  from the prefill;
- a whole answer (not streamed: its first-token time is unknown): its error against
  `total(p, n)` is shared between all three over `(1, p / PROMPT_SCALE, (n - 1) /
  OUTPUT_SCALE)`. The prefill of its own prompt is thus predicted and taken off before
  anything is learned about decoding.

Each step moves the prediction for a request of the same shape `_ALPHA` of the way to
what was seen (all of the way for the first request, or the first with a time per output
token to learn), and the prediction for a request
of another shape by `(x . y) / (x . x)` of that, `x` and `y` the two requests' features.
So a tenant's prefill-heavy requests (a 100,000-token prompt and `max_tokens` 2: `x` =
`(1, 100, 0.125)`) teach the prefill rate and move the prediction of a chat request
(100 prompt tokens, 100 output: `y` = `(1, 0.1, 12.4)`) by about 0.1% of their own
error; before, their prefill divided by one output token became everyone's time per
token. The scales are about the tokens that take as long as the base wait: prefill runs
about 0.1 to 0.5 ms a prompt token, decoding 10 to 50 ms an output token. The
coefficients never go below 0.
"""

from __future__ import annotations

import math

# The time per output token a cut request is charged at while its model has none measured
# (a new process, or requests that never finish): 1,000 tokens a second, faster than one
# request decodes on any GPU today, so the bound still errs for the replica. (Charging
# all of `max_tokens` until a first answer made every 50 ms cut of a fresh gateway cost
# 1,000 tokens: the hostile review of issue 40.)
FASTEST_TOKEN_S = 0.001
# Weight of the newest observation: about the last 10 requests dominate.
_ALPHA = 0.2
# Prompt tokens, and output tokens, that count as one unit of their feature.
PROMPT_SCALE = 1000.0
OUTPUT_SCALE = 8.0


class LatencyTracker:
    """One model's first-token time, prefill time per prompt token and time per output
    token, as a linear model learned online."""

    __slots__ = ("per_token_s", "prefill_s", "ttft_s")

    def __init__(self) -> None:
        # None until a request has been observed.
        self.ttft_s: float | None = None
        self.prefill_s = 0.0
        self.per_token_s: float | None = None

    def observe(
        self, ttft_s: float | None, total_s: float, tokens: int, prompt_tokens: int
    ) -> None:
        """Record a finished request: its first-token time (None when not streamed), its
        whole time, its output tokens and its prompt tokens (the estimate its deadline
        was predicted with)."""
        p = max(0, prompt_tokens)
        q = p / PROMPT_SCALE
        base = self.ttft_s
        step = 1.0 if base is None else _ALPHA
        base = base or 0.0
        if ttft_s is not None:
            gain = step * (ttft_s - base - self.prefill_s * p) / (1.0 + q * q)
            self.ttft_s = max(0.0, base + gain)
            self.prefill_s = max(0.0, self.prefill_s + gain * q / PROMPT_SCALE)
            if tokens > 1:
                per_token = max(0.0, total_s - ttft_s) / (tokens - 1)
                self.per_token_s = _ewma(self.per_token_s, per_token)
            return
        r = max(0, tokens - 1) / OUTPUT_SCALE
        decode = self.per_token_s
        if decode is None:
            decode = 0.0
            if r:
                step = 1.0  # the first time per token seen: all of it, as for the base
        predicted = base + self.prefill_s * p + decode * max(0, tokens - 1)
        gain = step * (total_s - predicted) / (1.0 + q * q + r * r)
        self.ttft_s = max(0.0, base + gain)
        self.prefill_s = max(0.0, self.prefill_s + gain * q / PROMPT_SCALE)
        if r:
            self.per_token_s = max(0.0, decode + gain * r / OUTPUT_SCALE)

    def expected_s(self, stream: bool, max_tokens: int, prompt_tokens: int) -> float:
        """The usual wait for the first token (streams) or the whole answer (otherwise)
        of a request with `prompt_tokens`; 0 while nothing has been observed."""
        ttft = (self.ttft_s or 0.0) + self.prefill_s * max(0, prompt_tokens)
        if stream:
            return ttft
        return ttft + (self.per_token_s or 0.0) * max(0, max_tokens - 1)

    def most_generated(self, ran_s: float, max_tokens: int) -> int:
        """The most output tokens a request could have had after running `ran_s` (cut
        then, before its answer was seen): that time over the measured time per token
        (`FASTEST_TOKEN_S` while none is measured yet), rounded up, at most `max_tokens`.
        A bound, not a guess: the prefill and the first token's wait are not taken off.

        Never faster than `FASTEST_TOKEN_S`: a fresh model's time per token is first learned
        from a deadline's lower bound (`max_tokens` counted as made in the time waited:
        50 ms over 1,000 tokens), which as a rate would charge all of `max_tokens` for any
        cut (the second hostile review of issue 40)."""
        per_token = max(self.per_token_s or 0.0, FASTEST_TOKEN_S)
        return min(max_tokens, math.ceil(max(0.0, ran_s) / per_token))


def _ewma(current: float | None, value: float) -> float:
    return value if current is None else current + _ALPHA * (value - current)
