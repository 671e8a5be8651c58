"""Usage records for the ledger's tests, and the one report both stores must answer."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from gateway.ledger.usage_records import UsageRecord

T0 = 1_700_000_000.0


def sample(i: int, prefix: str = "", **fields: object) -> UsageRecord:
    """The i-th record of a small, known mix: 3 tenants, 2 keys, 2 models, 2 endpoints."""
    record = UsageRecord(
        ts=T0 + i,
        request_id=f"{prefix or 'r'}-{i}",
        tenant=("acme", "globex", "initech")[i % 3],
        key_id=("k1", "k2")[i % 2],
        endpoint=("chat", "responses")[i % 2],
        model_requested=("coder", "chat")[i % 5 == 4],
        model_served=("llama-8b", "llama-70b")[i % 2],
        prompt_tokens=100 + i,
        cached_tokens=i % 10,
        completion_tokens=20 + i,
        cost_micros=1000 + i,
        latency_ms=float(i % 40),
        status=200 if i % 7 else 503,
        fallback="",
        ttft_ms=float(i % 13) * 10 if i % 7 else None,
        batch_id=("", "batch_1")[i % 4 == 3],
    )
    for name, value in fields.items():
        setattr(record, name, value)
    return record


MCP_SERVERS = ("github", "files")
# How an MCP tool call can end, in the order `with_mcp_calls` gives them out.
MCP_OUTCOMES = (
    "ok", "tool_error", "timeout", "refused", "blocked", "too_large", "unavailable", "error",
    "malformed", "rate_limited",
)  # fmt: skip
# The outcomes of a call that failed: its HTTP status is 200 all the same (a JSON-RPC
# error is an answer), and the report counts it an error.
FAILED_CALLS = frozenset(
    ("refused", "blocked", "timeout", "too_large", "unavailable", "error", "malformed")
)


def mcp_call(i: int, outcome: str = "ok", **fields: object) -> UsageRecord:
    """The i-th record as an MCP tool call that ended with `outcome`: on endpoint `mcp`,
    its server as the model, no tokens nor cost, the bytes it sent and got back; HTTP 200
    whatever the tool did, 429 when the call was over its rate (never sent)."""
    server = MCP_SERVERS[i % 2]
    limited = outcome == "rate_limited"
    call: dict[str, Any] = {
        "endpoint": "mcp", "model_requested": server, "model_served": server,
        "prompt_tokens": 0, "cached_tokens": 0, "completion_tokens": 0, "cost_micros": 0,
        "ttft_ms": None, "batch_id": "", "status": 429 if limited else 200,
        "bytes_in": 0 if limited else 40 + 3 * i,
        "bytes_out": 0 if limited else 1000 * i + 17,
        "outcome": outcome,
    }  # fmt: skip
    return replace(sample(i), **{**call, **fields})


def with_mcp_calls(count: int) -> list[UsageRecord]:
    """`count` records of which every fifth (from the third) is an MCP tool call, ending
    with each of `MCP_OUTCOMES` in turn; the others are `sample`s, with no bytes and no
    outcome. The calls fall to every tenant and key."""
    records = []
    for i in range(count):
        if i % 5 != 2:
            records.append(sample(i))
            continue
        records.append(mcp_call(i, MCP_OUTCOMES[i // 5 % len(MCP_OUTCOMES)]))
    return records


# MCP tool calls (each answered HTTP 200 but the one over its rate, 429) and whether the
# report counts each an error: a call that failed does, one the tool answered does not
# (an error of the tool's own is its answer).
COUNTED = {
    "ok": 0, "tool_error": 0, "timeout": 1, "refused": 1, "blocked": 1, "too_large": 1,
    "unavailable": 1, "error": 1, "malformed": 1, "rate_limited": 1,
}  # fmt: skip


def calls_that_ended_each_way() -> list[UsageRecord]:
    """An MCP call for each outcome (status 200 but `rate_limited`'s), then a request
    served and one refused for its rate (429, `rate_requests`)."""
    calls = [mcp_call(i, outcome) for i, outcome in enumerate(COUNTED)]
    assert {call.status for call in calls[:-1]} == {200} and calls[-1].status == 429
    served = sample(20, status=200)
    refused = sample(21, status=429, outcome="rate_requests")
    return [*calls, served, refused]


def unique_prefix() -> str:
    """A prefix that no other run's request ids share."""
    return os.urandom(4).hex()


def is_error(record: UsageRecord) -> bool:
    """Whether the report counts the record an error: an HTTP status of 400 or above, or
    an MCP tool call that failed (answered 200)."""
    return record.status >= 400 or record.outcome in FAILED_CALLS


def expected_report(
    records: list[UsageRecord], since: float, until: float, by: tuple[str, ...]
) -> list[dict[str, object]]:
    """The report computed in Python, to compare with what each store answers."""
    columns = {
        "tenant": "tenant", "key": "key_id", "model": "model_served",
        "requested": "model_requested", "endpoint": "endpoint", "batch": "batch_id",
        "outcome": "outcome",
    }  # fmt: skip
    groups: dict[tuple[object, ...], list[UsageRecord]] = {}
    for record in records:
        if since <= record.ts < until:
            key = tuple(getattr(record, columns[name]) for name in by)
            groups.setdefault(key, []).append(record)
    rows = []
    for key in sorted(groups):
        members = groups[key]
        latencies = sorted(record.latency_ms for record in members)

        def percentile(q: float, latencies: list[float] = latencies) -> float:
            # The nearest rank: the least value whose rank is at least q * n.
            rank = next(r for r in range(1, len(latencies) + 1) if r >= q * len(latencies))
            return latencies[rank - 1]

        rows.append(
            {
                **dict(zip(by, key, strict=True)),
                "requests": len(members),
                "prompt_tokens": sum(r.prompt_tokens for r in members),
                "cached_tokens": sum(r.cached_tokens for r in members),
                "completion_tokens": sum(r.completion_tokens for r in members),
                "cost_micros": sum(r.cost_micros for r in members),
                "bytes_in": sum(r.bytes_in for r in members),
                "bytes_out": sum(r.bytes_out for r in members),
                "errors": sum(1 for r in members if is_error(r)),
                "latency_p50_ms": percentile(0.5),
                "latency_p95_ms": percentile(0.95),
            }
        )
    return rows
