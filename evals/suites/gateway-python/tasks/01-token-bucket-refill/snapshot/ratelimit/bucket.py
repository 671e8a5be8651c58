"""A token bucket rate limiter driven by an injected clock."""

from __future__ import annotations

from collections.abc import Callable

Clock = Callable[[], float]


class TokenBucket:
    """Holds at most ``burst`` tokens and gains ``rate`` tokens per second.

    The bucket starts full. ``try_acquire(n)`` takes ``n`` tokens and returns True
    if that many are available; otherwise it takes nothing and returns False.
    ``clock`` returns seconds (for example ``time.monotonic``).
    """

    def __init__(self, rate: float, burst: float, clock: Clock) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError("rate and burst must be positive")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = burst
        self._last = clock()

    def _refill(self) -> None:
        now = self._clock()
        elapsed = max(0.0, now - self._last)
        self._tokens += elapsed * self.rate
        self._last = now

    def available(self) -> float:
        """Tokens that could be taken right now."""
        self._refill()
        return min(self._tokens, self.burst)

    def try_acquire(self, n: float = 1.0) -> bool:
        self._refill()
        if n <= self._tokens:
            self._tokens -= n
            return True
        return False

    def retry_after(self, n: float = 1.0) -> float:
        """Seconds until ``n`` tokens will be available; 0.0 if they are now.

        Raises ValueError if ``n`` exceeds the burst (it would never succeed).
        """
        if n > self.burst:
            raise ValueError(f"cannot ever acquire {n} tokens with burst {self.burst}")
        self._refill()
        missing = n - self._tokens
        return max(0.0, missing / self.rate)
