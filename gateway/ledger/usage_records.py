"""One usage record per request: what the ledger stores and reports on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The record's fields in their stored order: the tables' columns, the spool's JSON arrays.
COLUMNS = (
    "ts",
    "request_id",
    "tenant",
    "key_id",
    "endpoint",
    "model_requested",
    "model_served",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "cost_micros",
    "latency_ms",
    "status",
    "fallback",
    "ttft_ms",
    "batch_id",
    "bytes_in",
    "bytes_out",
    "outcome",
)
# A spool line written before `ttft_ms`, `batch_id` or the bytes were recorded has the
# columns before them: what it lacks is filled in (no time to first token, no batch, no
# bytes).
_FILLED = {
    len(COLUMNS) - 5: (None, "", 0, 0, ""),
    len(COLUMNS) - 4: ("", 0, 0, ""),
    len(COLUMNS) - 3: (0, 0, ""),
    len(COLUMNS) - 1: ("",),
}

Row = tuple[
    float, str, str, str, str, str, str, int, int, int, int, float, int, str, float | None, str,
    int, int, str,
]  # fmt: skip


@dataclass(slots=True)
class UsageRecord:
    """What one request used and how it ended.

    `ts` is when it ended (unix seconds); `request_id` is the gateway's own id, unique, the
    ledger's key (a record replayed twice is stored once). `cost_micros` is in millionths
    of the price table's currency, an integer so that sums are exact. `key_id` and
    `fallback` are "" when there is no key or no fallback (the model that stood in).
    `ttft_ms` is a stream's time to its first token, None when it had none (refused,
    failed before one, not streamed). `batch_id` is the batch it was a line of (the
    Batch APIs), "" for a client's own request. `bytes_in` and `bytes_out` are what an MCP
    tool call sent its server (the arguments, as JSON) and got back (its result), 0 for
    anything else. `outcome` is how an MCP tool call ended (`ok`, `tool_error`,
    `refused`, `blocked`, `timeout`, `too_large`, `unavailable`, `error`, `malformed`,
    `rate_limited`), or why the gateway refused any other request (`rate_requests`,
    `queue_full`, ...); "" for one served.
    """

    ts: float
    request_id: str
    tenant: str
    key_id: str
    endpoint: str
    model_requested: str
    model_served: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    cost_micros: int
    latency_ms: float
    status: int
    fallback: str = ""
    ttft_ms: float | None = None
    batch_id: str = ""
    bytes_in: int = 0
    bytes_out: int = 0
    outcome: str = ""

    def row(self) -> Row:
        """The record's values in `COLUMNS` order."""
        return (
            self.ts,
            self.request_id,
            self.tenant,
            self.key_id,
            self.endpoint,
            self.model_requested,
            self.model_served,
            self.prompt_tokens,
            self.cached_tokens,
            self.completion_tokens,
            self.cost_micros,
            self.latency_ms,
            self.status,
            self.fallback,
            self.ttft_ms,
            self.batch_id,
            self.bytes_in,
            self.bytes_out,
            self.outcome,
        )


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def clean_row(row: Row) -> Row:
    """The row with what a database refuses made storable: NUL characters taken out of
    its texts (PostgreSQL's text cannot hold one, and `model_requested` is the client's
    choice), counts held within 64 bits. A store falls back to it when a batch is refused
    for its data: one odd record must not stop the ledger, its batch retried forever."""
    return tuple(
        value.replace("\x00", "")
        if isinstance(value, str)
        else max(INT64_MIN, min(INT64_MAX, value))
        if isinstance(value, int)
        else value
        for value in row
    )  # type: ignore[return-value]


def from_row(values: list[Any] | tuple[Any, ...]) -> UsageRecord:
    """A record from its values in `COLUMNS` order (a spool line, a table row).

    Raises `ValueError` when there are not as many values as columns, or one is of the
    wrong type: a spool line cut short by a crash is refused, not half read.
    """
    filled = _FILLED.get(len(values))
    if filled is not None:
        values = (*values, *filled)
    if len(values) != len(COLUMNS):
        raise ValueError(f"a usage record has {len(COLUMNS)} values, not {len(values)}")
    (ts, request_id, tenant, key_id, endpoint, requested, served) = values[:7]
    (prompt, cached, completion, cost, latency, status, fallback, ttft, batch_id) = values[7:16]
    bytes_in, bytes_out, outcome = values[16:]
    texts = (request_id, tenant, key_id, endpoint, requested, served, fallback, batch_id, outcome)
    for text in texts:
        if not isinstance(text, str):
            raise ValueError(f"a usage record's text field is {type(text).__name__}")
    for number in (prompt, cached, completion, cost, status, bytes_in, bytes_out):
        if not isinstance(number, int) or isinstance(number, bool):
            raise ValueError(f"a usage record's count is {type(number).__name__}")
    if not isinstance(ts, int | float) or not isinstance(latency, int | float):
        raise ValueError("a usage record's time or latency is not a number")
    if ttft is not None and (not isinstance(ttft, int | float) or isinstance(ttft, bool)):
        raise ValueError("a usage record's time to first token is not a number")
    return UsageRecord(
        float(ts),
        request_id,
        tenant,
        key_id,
        endpoint,
        requested,
        served,
        prompt,
        cached,
        completion,
        cost,
        float(latency),
        status,
        fallback,
        None if ttft is None else float(ttft),
        batch_id,
        bytes_in,
        bytes_out,
        outcome,
    )
