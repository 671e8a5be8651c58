"""A finished batch's results as its API writes them, one JSON line per input line.

- **OpenAI**: the output file holds the lines answered 2xx, the error file every other
  (answered with an error: its `response`; never run: `response` null and `error`).
  Each line's `id` is `batch_req_...`, the same however often it is written.
- **Anthropic**: one results file, every line: `succeeded` (the message), `errored`
  (the error), `canceled`, `expired`.

Lines are composed as bytes around the stored JSON bodies (a 200 MB output is never
parsed again).
"""

from __future__ import annotations

import hashlib
import json

from gateway.batches.batch_records import LineResult, LineState


def batch_request_id(batch_id: str, line_no: int) -> str:
    """A line's `id` in OpenAI's output: stable, so a rewritten file repeats it."""
    digest = hashlib.sha256(f"{batch_id}:{line_no}".encode()).hexdigest()[:24]
    return f"batch_req_{digest}"


def openai_line(batch_id: str, line: LineResult) -> tuple[bool, bytes]:
    """`line`'s line of OpenAI's output (True) or error file (False)."""
    head = (
        b'{"id":' + _string(batch_request_id(batch_id, line.line_no))
        + b',"custom_id":' + (_string(line.custom_id) if line.custom_id else b"null")
    )  # fmt: skip
    if line.status_code is not None:
        response = (
            b',"response":{"status_code":' + str(line.status_code).encode()
            + b',"request_id":' + _string(line.request_id or "")
            + b',"body":' + (line.result or "null").encode() + b'},"error":null}\n'
        )  # fmt: skip
        return line.state is LineState.DONE, head + response
    return False, head + b',"response":null,"error":' + (line.result or "null").encode() + b"}\n"


def anthropic_line(line: LineResult) -> bytes:
    """`line`'s line of Anthropic's results."""
    head = b'{"custom_id":' + _string(line.custom_id) + b',"result":'
    if line.state is LineState.DONE:
        result = b'{"type":"succeeded","message":' + (line.result or "null").encode() + b"}"
    elif line.state is LineState.CANCELLED:
        result = b'{"type":"canceled"}'
    elif line.state is LineState.EXPIRED:
        result = b'{"type":"expired"}'
    elif line.status_code is not None:
        result = b'{"type":"errored","error":' + (line.result or "null").encode() + b"}"
    else:  # refused when the batch was made: its `{"code", "message"}`
        problem = json.loads(line.result or "{}")
        error = {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": problem.get("message", "")},
        }
        result = b'{"type":"errored","error":' + json.dumps(error).encode() + b"}"
    return head + result + b"}\n"


def _string(text: str) -> bytes:
    return json.dumps(text).encode()
