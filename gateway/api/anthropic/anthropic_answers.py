"""Anthropic Messages answers: the `message` object, its stream of events, its errors and
its rate-limit headers, written from the gateway's internal results."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import orjson
from starlette.datastructures import Headers
from starlette.responses import Response

from gateway.api.errors import APIError
from gateway.inference.types import Completion, InferenceRequest, ToolCallDelta, Usage

# OpenAI's finish reasons as Anthropic's stop reasons. A stop string ends the text as
# the model's own end does: the upstreams do not say which, so both are `end_turn`.
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}

# Anthropic's error types by HTTP status.
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def credentials(headers: Headers) -> str | None:
    """The caller's key: `x-api-key` (Anthropic's clients) or `Authorization: Bearer`."""
    key = headers.get("x-api-key")
    return f"Bearer {key}" if key else headers.get("authorization")


def message_body(
    parts: Sequence[InferenceRequest],
    completions: Sequence[Completion],
    *,
    response_id: str,
    model: str,
) -> bytes:
    """The `message` object of a whole answer."""
    completion = completions[0]
    content: list[dict[str, Any]] = []
    if completion.text or not completion.tool_calls:
        content.append({"type": "text", "text": completion.text})
    for call in completion.tool_calls:
        content.append(
            {"type": "tool_use", "id": call.id, "name": call.name, "input": _input(call.arguments)}
        )
    return orjson.dumps(
        {
            "id": response_id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": STOP_REASONS.get(completion.finish_reason, "end_turn"),
            "stop_sequence": None,
            "usage": _usage(completion.usage),
        }
    )


def _input(arguments: str) -> Any:
    """A call's arguments as the object Anthropic's `input` is (the parsers only give
    calls whose arguments are JSON; an empty text is no arguments)."""
    try:
        value = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _usage(usage: Usage) -> dict[str, int]:
    return {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens}


def _event(name: bytes, data: dict[str, Any]) -> bytes:
    return b"event: " + name + b"\ndata: " + orjson.dumps(data) + b"\n\n"


PING = _event(b"ping", {"type": "ping"})


class MessageStreamWriter:
    """Anthropic's event sequence for one streamed answer: `message_start`, then each
    content block (`text`, `tool_use`) opened, filled by deltas and closed in turn,
    then `message_delta` (stop reason, usage) and `message_stop`."""

    def __init__(
        self, request: InferenceRequest, response_id: str, model: str, prompt_estimate: int
    ) -> None:
        self._id, self._model, self._prompt_estimate = response_id, model, prompt_estimate
        # The open block's index and kind ("text" or the tool call's index), if one is.
        self._block = -1
        self._open: object = None
        # The open call's arguments: relayed once they start as an object (True), held
        # back when they do not (False: `input` stays `{}`, as a whole answer's), or
        # undecided while only whitespace came (None, with what came).
        self._relay: bool | None = None
        self._held = ""

    def start(self) -> bytes:
        message: dict[str, Any] = {
            "id": self._id,
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self._prompt_estimate, "output_tokens": 0},
        }
        return _event(b"message_start", {"type": "message_start", "message": message}) + PING

    def _switch(self, kind: object, block: dict[str, Any]) -> bytes:
        """Close the open block, open the next."""
        events = self._stop()
        self._block += 1
        self._open = kind
        start = {"type": "content_block_start", "index": self._block, "content_block": block}
        return events + _event(b"content_block_start", start)

    def _stop(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        return _event(b"content_block_stop", {"type": "content_block_stop", "index": self._block})

    def _delta(self, delta: dict[str, Any]) -> bytes:
        body = {"type": "content_block_delta", "index": self._block, "delta": delta}
        return _event(b"content_block_delta", body)

    def text(self, text: str, logprobs: list[Any] | None = None, index: int = 0) -> bytes:
        events = b""
        if self._open != "text":
            events = self._switch("text", {"type": "text", "text": ""})
        return events + self._delta({"type": "text_delta", "text": text})

    def tool_calls(self, fragments: tuple[ToolCallDelta, ...], index: int = 0) -> bytes:
        events = b""
        for fragment in fragments:
            if fragment.id is not None:
                block: dict[str, Any] = {
                    "type": "tool_use",
                    "id": fragment.id,
                    "name": fragment.name,
                    "input": {},
                }
                events += self._switch(("call", fragment.index), block)
                self._relay, self._held = None, ""
            arguments = fragment.arguments
            if arguments and self._relay is None:
                self._held += arguments
                arguments = self._held.lstrip()
                if arguments:  # `input` is an object: anything else is not relayed
                    self._relay = arguments.startswith("{")
            if arguments and self._relay:
                delta = {"type": "input_json_delta", "partial_json": arguments}
                events += self._delta(delta)
        return events

    def close(self, finish_reason: str, usage: Usage) -> bytes:
        delta = {
            "type": "message_delta",
            "delta": {
                "stop_reason": STOP_REASONS.get(finish_reason, "end_turn"),
                "stop_sequence": None,
            },
            # Input tokens too: `message_start` could only carry the gateway's estimate;
            # here is what the upstream counted, which the SDKs take over (cumulative).
            "usage": _usage(usage),
        }
        return (
            self._stop()
            + _event(b"message_delta", delta)
            + _event(b"message_stop", {"type": "message_stop"})
        )

    def error(self, error: APIError) -> bytes:
        return _event(b"error", error_body(error))

    def answer(self) -> dict[str, Any] | None:
        """Messages are not kept."""
        return None


# What an Anthropic client is told of a key it sent that is not one: it sends `x-api-key`.
_INVALID_KEY = "Incorrect API key provided. Pass it as `x-api-key: KEY` (or as a Bearer token)."


def error_body(error: APIError) -> dict[str, Any]:
    """Anthropic's error object for `error`."""
    # Anthropic's own rule: a 4xx without a type of its own is an invalid request.
    other = "invalid_request_error" if 400 <= error.status < 500 else "api_error"
    kind = _ERROR_TYPES.get(error.status, other)
    if error.code == "insufficient_quota":
        kind = "billing_error"  # Anthropic's word for an account out of credit
    message = _INVALID_KEY if error.code == "invalid_api_key" else error.message
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_response(error: APIError) -> Response:
    """An error as Anthropic answers it, with its rate-limit headers and `request-id`."""
    error.headers.update(anthropic_headers(error.headers))
    if error.code == "insufficient_quota":
        # Anthropic answers `billing_error` with 402 (OpenAI: 429): its SDK raises an
        # APIStatusError and does not retry it.
        error.status = 402
    return error.response(error_body(error))


def anthropic_headers(headers: dict[str, str]) -> dict[str, str]:
    """The headers Anthropic's clients read, from the gateway's own: `request-id` (the
    SDKs' `_request_id`) and `anthropic-ratelimit-*`."""
    out = ratelimit_headers(headers)
    request_id = headers.get("x-request-id")
    if request_id is not None:
        out["request-id"] = request_id
    return out


_DURATION = re.compile(r"(?:(\d+)h)?(?:(\d+)m(?!s))?(?:([\d.]+)s)?(?:(\d+)ms)?")


def ratelimit_headers(headers: dict[str, str]) -> dict[str, str]:
    """`anthropic-ratelimit-*` from OpenAI's `x-ratelimit-*` (reset as an RFC 3339 time)."""
    out = {}
    for kind in ("requests", "tokens"):
        limit = headers.get(f"x-ratelimit-limit-{kind}")
        if limit is None:
            continue
        out[f"anthropic-ratelimit-{kind}-limit"] = limit
        out[f"anthropic-ratelimit-{kind}-remaining"] = headers[f"x-ratelimit-remaining-{kind}"]
        reset = time.time() + _seconds(headers[f"x-ratelimit-reset-{kind}"])
        out[f"anthropic-ratelimit-{kind}-reset"] = (
            datetime.fromtimestamp(reset, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        )
    return out


def _seconds(duration: str) -> float:
    """Seconds of a duration as `gateway.ratelimit.headers.duration` writes it."""
    match = _DURATION.fullmatch(duration)
    if match is None:
        return 0.0
    hours, minutes, seconds, millis = match.groups()
    return (
        int(hours or 0) * 3600
        + int(minutes or 0) * 60
        + float(seconds or 0)
        + int(millis or 0) / 1000
    )
