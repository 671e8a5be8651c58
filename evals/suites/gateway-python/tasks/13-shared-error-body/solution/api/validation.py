"""Checks on a chat completion request body before it is routed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from api.errors import error_body

_INVALID = "invalid_request_error"


def validate_chat_request(body: Mapping[str, Any]) -> tuple[int, dict[str, Any]] | None:
    """None if ``body`` is acceptable, else (400, error body) for the first problem."""
    if not isinstance(body.get("model"), str):
        return 400, error_body(
            "'model' is required.", _INVALID, param="model", code="missing_required_parameter"
        )
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return 400, error_body(
            "'messages' must be a non-empty array.",
            _INVALID,
            param="messages",
            code="invalid_value",
        )
    temperature = body.get("temperature", 1.0)
    if not isinstance(temperature, int | float) or not 0 <= temperature <= 2:
        return 400, error_body(
            "'temperature' must be between 0 and 2.",
            _INVALID,
            param="temperature",
            code="invalid_value",
        )
    return None
