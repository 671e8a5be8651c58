"""Reading usage from an upstream's OpenAI-compatible response body."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from usage.model import Usage


def _count(raw: Mapping[str, Any], key: str) -> int:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"upstream usage.{key} is not an integer: {value!r}")
    return value


def _cached_tokens(raw: Mapping[str, Any]) -> int:
    details = raw.get("prompt_tokens_details")
    if details is None:
        return 0
    if not isinstance(details, Mapping):
        raise ValueError("upstream usage.prompt_tokens_details is not an object")
    if details.get("cached_tokens") is None:
        return 0
    return _count(details, "cached_tokens")


def usage_from_upstream(body: Mapping[str, Any]) -> Usage:
    """The ``usage`` object of a response (or final stream chunk) as a Usage.

    Raises ValueError if it is missing or malformed.
    """
    raw = body.get("usage")
    if not isinstance(raw, Mapping):
        raise ValueError("upstream response has no usage object")
    return Usage(
        prompt_tokens=_count(raw, "prompt_tokens"),
        completion_tokens=_count(raw, "completion_tokens"),
        cached_tokens=_cached_tokens(raw),
    )
