"""Which model versions support which request features."""

from __future__ import annotations

from compat.semver import compare_versions

# feature -> first model version that supports it
FEATURE_SINCE: dict[str, str] = {
    "tools": "1.2",
    "json_schema": "1.4.0",
    "logprobs": "2.0",
}


def model_supports(model_version: str, feature: str) -> bool:
    """Whether a model at ``model_version`` supports ``feature``.

    Raises KeyError for an unknown feature and ValueError for a malformed version.
    """
    return compare_versions(model_version, FEATURE_SINCE[feature]) >= 0
