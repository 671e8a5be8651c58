"""The error a client sees: its HTTP status and OpenAI's error body, one shape for every
refusal, from the connection's own (`protocol.py`) to the API's (`gateway.api.errors`
maps every other refusal to one)."""

from __future__ import annotations

import math

import orjson
from starlette.responses import Response

from gateway.observability.logging import redact


class APIError(Exception):
    """An error the client sees, with its HTTP status and OpenAI error body.

    `message` is redacted once, here: upstream error text it carries never shows a
    secret to the client (JSON body, SSE error event) or to the logs.
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        retry_after_s: float | None = None,
        headers: dict[str, str] | None = None,
        reason: str | None = None,
    ) -> None:
        message = redact(message)
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s
        self.headers = headers or {}
        # Why the gateway refused the request, for metrics and logs (None: not a refusal).
        self.reason = reason

    def body(self) -> dict[str, object]:
        """The JSON body, also used as the payload of a terminal SSE error event."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self, body: dict[str, object] | None = None) -> Response:
        """The HTTP answer: `body` (default: OpenAI's error object), this error's status
        and headers, and `Retry-After` when waiting helps."""
        headers = dict(self.headers)
        if self.retry_after_s is not None:
            # Retry-After takes whole seconds; round up so a client never comes back early.
            headers["retry-after"] = str(max(1, math.ceil(self.retry_after_s)))
        return Response(
            orjson.dumps(self.body() if body is None else body),
            status_code=self.status,
            headers=headers,
            media_type="application/json",
        )
