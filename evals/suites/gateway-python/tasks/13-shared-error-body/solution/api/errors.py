"""The OpenAI error envelope that every API error response uses."""

from __future__ import annotations

from typing import Any


def error_body(
    message: str, type: str, *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """``{"error": {"message", "type", "param", "code"}}``, all four keys present."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}
