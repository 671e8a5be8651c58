"""Node failures: each node fails after an exponential uptime (seeded) and is repaired
after a fixed time. Pure: the draws come from a `random.Random` the caller seeds."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol

HOUR = 3600.0


class FailureSource(Protocol):
    """What the replay needs from a failure model (tests script one)."""

    @property
    def repair_s(self) -> float:
        """Seconds a failed node stays cordoned."""
        ...

    def next_failure(self, up_since: float) -> float:
        """When a node that has been up since `up_since` fails next."""
        ...


@dataclass(slots=True)
class FailureModel:
    """Independent exponential failures with mean `mtbf_s` of uptime per node, each
    followed by `repair_s` seconds cordoned."""

    mtbf_s: float
    repair_s: float
    rng: random.Random

    def __post_init__(self) -> None:
        if self.mtbf_s <= 0:
            raise ValueError("MTBF must be positive")
        if self.repair_s < 0:
            raise ValueError("repair time must not be negative")

    def next_failure(self, up_since: float) -> float:
        """When a node that has been up since `up_since` fails next."""
        return up_since + self.rng.expovariate(1.0 / self.mtbf_s)
