"""Bearer-token authentication of incoming requests."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any


def check_api_key(
    authorization: str | None, known_keys: Collection[str]
) -> tuple[int, dict[str, Any]] | None:
    """None if the Authorization header carries a known key, else (401, error body)."""
    if not authorization or not authorization.startswith("Bearer "):
        return 401, {
            "error": {
                "message": "Missing bearer token in the Authorization header.",
                "type": "invalid_request_error",
                "param": None,
                "code": "missing_api_key",
            }
        }
    if authorization.removeprefix("Bearer ").strip() not in known_keys:
        return 401, {
            "error": {
                "message": "Incorrect API key provided.",
                "type": "invalid_request_error",
                "param": None,
                "code": "invalid_api_key",
            }
        }
    return None
