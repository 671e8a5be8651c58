"""Refusing SDK versions with known protocol bugs, from the User-Agent header."""

from __future__ import annotations

import re

from compat.semver import compare_versions

_USER_AGENT = re.compile(r"(?P<sdk>[A-Za-z][\w.-]*)/(?P<version>\S+)")

MINIMUM_VERSIONS: dict[str, str] = {
    "openai-python": "1.40.0",
    "openai-node": "4.50",
}


def client_is_supported(user_agent: str) -> bool:
    """False only for a known SDK older than its minimum version.

    Unknown SDKs, user agents that do not parse and unparsable versions are allowed.
    """
    match = _USER_AGENT.match(user_agent.strip())
    if match is None:
        return True
    minimum = MINIMUM_VERSIONS.get(match["sdk"])
    if minimum is None:
        return True
    try:
        return compare_versions(match["version"], minimum) >= 0
    except ValueError:
        return True
