"""OpenAI's Responses API as a wire: `/v1/responses` (`responses_requests.py` parses its
bodies, `responses_answers.py` writes its answers and stream events) and its stored
responses (`responses_state.py`: kept, continued, retrieved, deleted)."""

from __future__ import annotations

from gateway.api.responses import responses_state
from gateway.api.responses.responses_answers import ResponseStreamWriter, response_body
from gateway.api.responses.responses_requests import parse_responses
from gateway.api.wire import Wire

RESPONSES = Wire(
    "responses",
    "resp_",
    parse_responses,
    response_body,
    ResponseStreamWriter,
    prepare=responses_state.prepare,
    keep=responses_state.keep,
)
