"""Exponential backoff with full jitter, the spacing between retries of one request.

Full jitter (AWS Architecture Blog, "Exponential Backoff And Jitter") draws each wait
uniformly from [0, min(cap, base * 2**attempt)]: retries that failed together spread
out instead of arriving again together, and the expected wait still doubles.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

# 2.0**1024 overflows a float; past this the ceiling is the cap anyway.
_MAX_EXPONENT = 1023


@dataclass(frozen=True, slots=True)
class Backoff:
    """Waits before retries: `delay(0)` before the first retry, `delay(1)` the second, ...

    `rng` makes the draws reproducible (tests); None uses the `random` module's
    shared generator.
    """

    base_s: float
    cap_s: float
    rng: random.Random | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        # Written as positive checks so NaN fails them too.
        if not (0 <= self.base_s < math.inf):
            raise ValueError(f"backoff base_s must be >= 0 and finite, not {self.base_s}")
        if not (0 <= self.cap_s < math.inf):
            raise ValueError(f"backoff cap_s must be >= 0 and finite, not {self.cap_s}")

    def ceiling(self, attempt: int) -> float:
        """The longest wait before retry `attempt` (0-based): min(cap, base * 2**attempt)."""
        if attempt < 0:
            raise ValueError(f"attempt must be >= 0, not {attempt}")
        # A product past the float range is inf, and min() turns it into the cap.
        return min(self.cap_s, self.base_s * 2.0 ** min(attempt, _MAX_EXPONENT))

    def delay(self, attempt: int) -> float:
        """A wait in seconds before retry `attempt` (0-based), uniform in [0, ceiling]."""
        ceiling = self.ceiling(attempt)
        uniform = self.rng.uniform if self.rng is not None else random.uniform
        return uniform(0.0, ceiling)
