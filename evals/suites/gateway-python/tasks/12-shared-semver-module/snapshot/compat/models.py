"""Which model versions support which request features."""

from __future__ import annotations

import re

_VERSION = re.compile(r"v?(\d+)(?:\.(\d+))?(?:\.(\d+))?")

# feature -> first model version that supports it
FEATURE_SINCE: dict[str, str] = {
    "tools": "1.2",
    "json_schema": "1.4.0",
    "logprobs": "2.0",
}


def _parse_version(text: str) -> tuple[int, int, int]:
    """ "v1.2" -> (1, 2, 0). Missing minor and patch numbers are 0."""
    match = _VERSION.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"not a version: {text!r}")
    major, minor, patch = (int(part) if part else 0 for part in match.groups())
    return major, minor, patch


def model_supports(model_version: str, feature: str) -> bool:
    """Whether a model at ``model_version`` supports ``feature``.

    Raises KeyError for an unknown feature and ValueError for a malformed version.
    """
    return _parse_version(model_version) >= _parse_version(FEATURE_SINCE[feature])
