"""Checks on a chat completion request body before it is routed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _invalid(message: str, param: str, code: str = "invalid_value") -> tuple[int, dict[str, Any]]:
    return 400, {
        "error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    }


def validate_chat_request(body: Mapping[str, Any]) -> tuple[int, dict[str, Any]] | None:
    """None if ``body`` is acceptable, else (400, error body) for the first problem."""
    if not isinstance(body.get("model"), str):
        return _invalid("'model' is required.", "model", "missing_required_parameter")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return _invalid("'messages' must be a non-empty array.", "messages")
    temperature = body.get("temperature", 1.0)
    if not isinstance(temperature, int | float) or not 0 <= temperature <= 2:
        return _invalid("'temperature' must be between 0 and 2.", "temperature")
    return None
