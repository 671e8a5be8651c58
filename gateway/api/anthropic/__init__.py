"""Anthropic's Messages API as a wire: `/v1/messages` (`anthropic_requests.py` parses its
bodies, `anthropic_answers.py` writes its answers, events and errors), and its
`/v1/messages/count_tokens` (`count_tokens.py`)."""

from __future__ import annotations

from gateway.api.anthropic.anthropic_answers import (
    PING,
    MessageStreamWriter,
    anthropic_headers,
    credentials,
    error_response,
    message_body,
)
from gateway.api.anthropic.anthropic_requests import parse_messages
from gateway.api.wire import Wire

MESSAGES = Wire(
    "messages",
    "msg_",
    parse_messages,
    message_body,
    MessageStreamWriter,
    credentials=credentials,
    render_error=error_response,
    more_headers=anthropic_headers,
    ping=PING,
)
