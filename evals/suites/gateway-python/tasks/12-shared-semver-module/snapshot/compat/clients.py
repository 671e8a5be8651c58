"""Refusing SDK versions with known protocol bugs, from the User-Agent header."""

from __future__ import annotations

import re

_VERSION = re.compile(r"v?(\d+)(?:\.(\d+))?(?:\.(\d+))?")
_USER_AGENT = re.compile(r"(?P<sdk>[A-Za-z][\w.-]*)/(?P<version>\S+)")

MINIMUM_VERSIONS: dict[str, str] = {
    "openai-python": "1.40.0",
    "openai-node": "4.50",
}


def _version_tuple(text: str) -> tuple[int, int, int]:
    match = _VERSION.fullmatch(text.strip())
    if not match:
        raise ValueError(f"not a version: {text!r}")
    return (
        int(match.group(1)),
        int(match.group(2) or 0),
        int(match.group(3) or 0),
    )


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
        version = _version_tuple(match["version"])
    except ValueError:
        return True
    return version >= _version_tuple(minimum)
