"""Retry settings for upstream calls, as read from the ``retry:`` config section."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 3
    base_delay_s: float = 0.1
    max_delay_s: float = 5.0
    jitter: bool = False

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.base_delay_s < 0 or self.max_delay_s < self.base_delay_s:
            raise ValueError("need 0 <= base_delay_s <= max_delay_s")

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> RetryPolicy:
        """Build a policy from config; missing keys keep their defaults."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"unknown retry settings: {', '.join(unknown)}")
        attempts = raw.get("max_attempts", cls.max_attempts)
        if isinstance(attempts, bool) or not isinstance(attempts, int):
            raise ValueError("max_attempts must be an integer")
        delays = {}
        for name in ("base_delay_s", "max_delay_s"):
            value = raw.get(name, getattr(cls, name))
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{name} must be a number")
            delays[name] = float(value)
        jitter = raw.get("jitter", cls.jitter)
        if not isinstance(jitter, bool):
            raise ValueError("jitter must be true or false")
        return cls(max_attempts=attempts, jitter=jitter, **delays)
