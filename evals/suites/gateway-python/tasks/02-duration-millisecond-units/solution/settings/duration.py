"""Go-style durations ("1m30s", "250ms", "1.5h") for timeouts and intervals in config."""

from __future__ import annotations

import re

_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")


def parse_duration(text: str) -> float:
    """Parse a duration into seconds.

    A duration is one or more parts, each a non-negative number followed by a unit:
    ``h``, ``m``, ``s`` or ``ms``. Parts may be combined ("1h2m3s", "1s500ms") and
    their values are added. Surrounding whitespace is ignored. Raises ValueError for
    an empty string, a number without a unit, an unknown unit or any other text.
    """
    stripped = text.strip()
    if not stripped:
        raise ValueError("invalid duration: empty string")
    total = 0.0
    position = 0
    for match in _PART.finditer(stripped):
        if match.start() != position:
            break
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        position = match.end()
    if position != len(stripped):
        raise ValueError(f"invalid duration: {text!r}")
    return total


def format_duration(seconds: float) -> str:
    """The shortest duration string for ``seconds``, at millisecond precision.

    ``format_duration(90) == "1m30s"``, ``format_duration(0.25) == "250ms"`` and
    ``format_duration(0) == "0s"``. Raises ValueError for a negative number.
    """
    if seconds < 0:
        raise ValueError("negative duration")
    millis = round(seconds * 1000)
    if millis == 0:
        return "0s"
    parts = []
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        count, millis = divmod(millis, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)
