"""A batch's input file read and checked before the batch is made (OpenAI's Batch API).

Each line is one request: `{"custom_id", "method": "POST", "url", "body"}`, the URL the
batch's endpoint. What makes the whole file unusable is refused at create with the limit
or the lines named (`BatchInputRefused`): more than 200 MB or 50,000 lines (OpenAI's
limits), no request at all, a `custom_id` used twice (the output is matched to the input
by it). A line that is only itself wrong (not JSON, not an object, another endpoint, not
POST, no body) does not stop the others: it becomes a line of the batch's error file
(`batch_output.openai_line` writes it), and the rest run. See docs/design/batches.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

MAX_FILE_BYTES = 200 * 1024 * 1024
MAX_LINES = 50_000
# A custom_id's length: it is echoed in every output line, and named in errors.
MAX_CUSTOM_ID_CHARS = 512
# How many of the lines that share a custom_id a refusal names.
_SHOWN_DUPLICATES = 5


class BatchInputRefused(ValueError):
    """The input file cannot make a batch; the message names why (a limit, lines)."""


@dataclass(frozen=True, slots=True)
class BatchLine:
    """One request of the batch: its line (1-based), `custom_id`, its body as JSON text
    (what is stored and run; the parsed body is not kept: a 200 MB file parsed whole is
    gigabytes), and what the batch checks of it at create: the model it names, whether
    it asks to stream."""

    line: int
    custom_id: str
    body: str
    model: object
    streams: bool


@dataclass(frozen=True, slots=True)
class LineError:
    """A line that cannot run, for the error file: its `custom_id` if it had one."""

    line: int
    custom_id: str | None
    code: str
    message: str


@dataclass(slots=True)
class BatchInput:
    """What a file holds for a batch: the requests to run, the lines that cannot."""

    lines: list[BatchLine] = field(default_factory=list)
    errors: list[LineError] = field(default_factory=list)

    @property
    def total(self) -> int:
        """The batch's `request_counts.total`: every request line, runnable or not."""
        return len(self.lines) + len(self.errors)


def read_batch_input(data: bytes, endpoint: str) -> BatchInput:
    """The requests of input file `data` for a batch on `endpoint` (`/v1/chat/completions`,
    ...); `BatchInputRefused` when the file as a whole cannot be one."""
    if len(data) > MAX_FILE_BYTES:
        raise BatchInputRefused(
            f"The input file is {len(data):,} bytes; a batch's may be at most "
            f"{MAX_FILE_BYTES:,} (200 MB)."
        )
    ending = len(data.rstrip())  # the newlines and spaces that end the file
    lines = data.count(b"\n", 0, ending) + 1 if ending else 0
    if lines > MAX_LINES:
        raise BatchInputRefused(
            f"The input file has {lines:,} lines; a batch may have at most {MAX_LINES:,} requests."
        )
    read = BatchInput()
    start = 0
    for number in range(1, lines + 1):
        end = data.find(b"\n", start, ending)
        end = ending if end < 0 else end
        raw = data[start:end]
        start = end + 1
        if not raw.strip():
            continue  # a blank line is no request (its number still counts)
        line = _read_line(number, raw, endpoint)
        if isinstance(line, BatchLine):
            read.lines.append(line)
        else:
            read.errors.append(line)
    if read.total == 0:
        raise BatchInputRefused("The input file holds no request.")
    _refuse_duplicates(read)
    return read


def request_line(number: int, custom_id: str, body: Any) -> BatchLine | LineError:
    """A request's body, checked and kept as JSON text (Anthropic's `params` too)."""
    if not isinstance(body, dict):
        return LineError(number, custom_id, "invalid_body", "`body` must be a JSON object.")
    try:
        text = orjson.dumps(body).decode()
    except orjson.JSONEncodeError:
        return LineError(number, custom_id, "invalid_body", "`body` is nested too deeply.")
    return BatchLine(number, custom_id, text, body.get("model"), body.get("stream") is True)


def _read_line(number: int, raw: bytes, endpoint: str) -> BatchLine | LineError:
    try:
        request = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return LineError(number, None, "invalid_json", f"Line {number} is not valid JSON.")
    if not isinstance(request, dict):
        return LineError(number, None, "invalid_request", f"Line {number} is not a JSON object.")
    custom_id = request.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return LineError(
            number, None, "missing_custom_id", f"Line {number} has no `custom_id` string."
        )
    if len(custom_id) > MAX_CUSTOM_ID_CHARS:
        return LineError(
            number,
            None,
            "invalid_custom_id",
            f"Line {number}'s `custom_id` is longer than {MAX_CUSTOM_ID_CHARS} characters.",
        )
    if request.get("method") != "POST":
        return LineError(number, custom_id, "invalid_method", "`method` must be `POST`.")
    if request.get("url") != endpoint:
        return LineError(
            number,
            custom_id,
            "mismatched_endpoint",
            f"`url` must be the batch's endpoint, `{endpoint}`.",
        )
    return request_line(number, custom_id, request.get("body"))


def _refuse_duplicates(read: BatchInput) -> None:
    """Refuse a file that uses a `custom_id` twice, naming it and its lines."""
    seen: dict[str, list[int]] = {}
    for number, custom_id in [
        *((r.line, r.custom_id) for r in read.lines),
        *((e.line, e.custom_id) for e in read.errors),
    ]:
        if custom_id is not None:
            seen.setdefault(custom_id, []).append(number)
    for custom_id, lines in seen.items():
        if len(lines) > 1:
            shown = ", ".join(str(n) for n in sorted(lines)[:_SHOWN_DUPLICATES])
            left = len(lines) - _SHOWN_DUPLICATES
            more = f" and {left} more" if left > 0 else ""
            raise BatchInputRefused(
                f"`custom_id` {orjson.dumps(custom_id[:64]).decode()} is on lines "
                f"{shown}{more}: each request's must be unique."
            )
