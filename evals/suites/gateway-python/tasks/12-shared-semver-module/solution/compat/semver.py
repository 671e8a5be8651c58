"""Version numbers such as "1.2", "v1.4.0" or "2": parsing and comparison."""

from __future__ import annotations

import re

_VERSION = re.compile(r"v?(\d+)(?:\.(\d+))?(?:\.(\d+))?")


def parse_version(text: str) -> tuple[int, int, int]:
    """ "v1.2" -> (1, 2, 0). Missing minor and patch numbers are 0.

    Surrounding whitespace is ignored; raises ValueError for anything else.
    """
    match = _VERSION.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"not a version: {text!r}")
    major, minor, patch = (int(part) if part else 0 for part in match.groups())
    return major, minor, patch


def compare_versions(a: str, b: str) -> int:
    """-1, 0 or 1 as version ``a`` is lower than, equal to or higher than ``b``."""
    left, right = parse_version(a), parse_version(b)
    return (left > right) - (left < right)
