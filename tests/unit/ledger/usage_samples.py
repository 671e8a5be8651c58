"""Usage records for the ledger's tests, and the one report both stores must answer."""

from __future__ import annotations

import os

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


def with_mcp_calls(count: int) -> list[UsageRecord]:
    """`count` records of which every fifth (from the third) is an MCP tool call: on
    endpoint `mcp`, its server as the model, no tokens nor cost, and the bytes it sent and
    got back; the others are `sample`s, with no bytes. The calls fall to every tenant and
    key."""
    records = []
    for i in range(count):
        if i % 5 != 2:
            records.append(sample(i))
            continue
        server = MCP_SERVERS[i % 2]
        records.append(
            sample(
                i,
                endpoint="mcp",
                model_requested=server,
                model_served=server,
                prompt_tokens=0,
                cached_tokens=0,
                completion_tokens=0,
                cost_micros=0,
                ttft_ms=None,
                batch_id="",
                bytes_in=40 + 3 * i,
                bytes_out=1000 * i + 17,
            )
        )
    return records


def unique_prefix() -> str:
    """A prefix that no other run's request ids share."""
    return os.urandom(4).hex()


def expected_report(
    records: list[UsageRecord], since: float, until: float, by: tuple[str, ...]
) -> list[dict[str, object]]:
    """The report computed in Python, to compare with what each store answers."""
    columns = {
        "tenant": "tenant", "key": "key_id", "model": "model_served",
        "requested": "model_requested", "endpoint": "endpoint", "batch": "batch_id",
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
                "errors": sum(1 for r in members if r.status >= 400),
                "latency_p50_ms": percentile(0.5),
                "latency_p95_ms": percentile(0.95),
            }
        )
    return rows
