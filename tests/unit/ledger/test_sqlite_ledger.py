"""The SQLite store on a real file: batches, duplicates, the report."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from gateway.ledger.ledger_store import open_store
from gateway.ledger.sqlite_ledger import SqliteLedger
from gateway.ledger.usage_records import COLUMNS, UsageRecord
from gateway.ledger.usage_report import ReportQuery
from gateway.ledger.usage_requests import RequestsQuery
from tests.unit.ledger.usage_samples import (
    COUNTED,
    MCP_OUTCOMES,
    T0,
    calls_that_ended_each_way,
    expected_report,
    mcp_call,
    sample,
    with_mcp_calls,
)

GROUPINGS = [
    (), ("tenant",), ("tenant", "key", "model"), ("endpoint", "model"), ("key",),
    ("requested", "model"),
]  # fmt: skip


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteLedger]:
    ledger = SqliteLedger(tmp_path / "deep" / "usage.db")
    yield ledger
    await ledger.close()


async def test_a_batch_is_stored_once(store: SqliteLedger) -> None:
    assert await store.write([sample(i) for i in range(50)]) == 50
    # A replay that overlaps: the known request ids are skipped.
    assert await store.write([sample(i) for i in range(40, 60)]) == 10
    assert await store.count() == 60


async def test_the_file_is_in_wal_mode_with_its_record_intact(store: SqliteLedger) -> None:
    await store.write([sample(7, fallback="llama-8b", outcome="no_replica")])
    with sqlite3.connect(store.path) as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        row = connection.execute("SELECT * FROM usage_ledger").fetchone()
    assert row == (
        "r-7",
        T0 + 7,
        "globex",
        "k2",
        "responses",
        "coder",
        "llama-70b",
        107,
        7,
        27,
        1007,
        7.0,
        503,
        "llama-8b",
        None,
        "batch_1",
        0,
        0,
        "no_replica",
    )


async def test_a_record_beyond_the_columns_is_stored_held_within(store: SqliteLedger) -> None:
    odd = sample(1, completion_tokens=2**70, model_requested="a\x00b")
    assert await store.write([sample(0), odd]) == 2
    with sqlite3.connect(store.path) as connection:
        stored = connection.execute(
            "SELECT completion_tokens, model_requested FROM usage_ledger WHERE request_id = 'r-1'"
        ).fetchone()
    assert stored == (2**63 - 1, "ab")  # the batch cleaned whole


@pytest.mark.parametrize("by", GROUPINGS)
async def test_the_report_groups_and_sums(store: SqliteLedger, by: tuple[str, ...]) -> None:
    records = [sample(i) for i in range(200)]
    await store.write(records)
    since, until = T0 + 17, T0 + 171
    rows = await store.query(ReportQuery(since, until, by))
    assert rows == expected_report(records, since, until, by)


async def test_an_empty_range_reports_zero_totals(store: SqliteLedger) -> None:
    await store.write([sample(i) for i in range(5)])
    (row,) = await store.query(ReportQuery(T0 + 100, T0 + 200))
    assert row["requests"] == 0 and row["cost_micros"] == 0
    assert row["latency_p50_ms"] is None
    assert await store.query(ReportQuery(T0 + 100, T0 + 200, ("tenant",))) == []


async def test_one_keys_requests_come_oldest_first_within_the_range(
    store: SqliteLedger,
) -> None:
    await store.write([sample(i) for i in range(100)])
    listed = await store.requests(RequestsQuery("k2", T0 + 10, T0 + 40, limit=5))
    # k2 holds the odd records: 11, 13, 15... the first five of the range, in order.
    assert [record.request_id for record in listed] == ["r-11", "r-13", "r-15", "r-17", "r-19"]
    assert listed[0] == sample(11)
    assert await store.requests(RequestsQuery("nobody's", T0, T0 + 100)) == []


async def test_a_file_from_before_the_newer_columns_gets_them(old_file: OldFile) -> None:
    store = SqliteLedger(old_file.path)
    new = sample(3, bytes_in=250, bytes_out=9000, outcome="timeout")
    try:
        await store.write([new])
        listed = await store.requests(RequestsQuery("k2", T0, T0 + 10))
        rows = await store.query(ReportQuery(T0, T0 + 10, ("outcome",)))
    finally:
        await store.close()
    with sqlite3.connect(old_file.path) as connection:
        columns = [row[1] for row in connection.execute("PRAGMA table_info(usage_ledger)")]
    assert columns == list(COLUMNS)  # the lacking ones added at the end, in order
    # The old record reads with what each column it lacked means: no time to first
    # token, no batch, no bytes, no outcome; the new one as written.
    assert listed == [old_file.old, new]
    assert [(r.ttft_ms, r.batch_id, r.bytes_in, r.bytes_out, r.outcome) for r in listed] == [
        old_file.read_as,
        (30.0, "batch_1", 250, 9000, "timeout"),
    ]
    # The old call's outcome is lost ("", not an error: its status was 200); the new
    # one's counts.
    assert [(row["outcome"], row["requests"], row["errors"]) for row in rows] == [
        ("", 1, 0),
        ("timeout", 1, 1),
    ]


class OldFile(NamedTuple):
    """A ledger file an older gateway wrote, its one record as a reader should find it,
    and that record's (ttft_ms, batch_id, bytes_in, bytes_out, outcome) spelled out."""

    path: Path
    old: UsageRecord
    read_as: tuple[object, ...]


# The columns a ledger file lacked before each was added (each file lacks those added
# after too), and what the old record's (ttft_ms, batch_id, bytes_in, bytes_out, outcome)
# read as: what a lacking column means, the rest as written.
LACKED: dict[str, tuple[tuple[str, ...], tuple[object, ...]]] = {
    "ttft": (("ttft_ms", "batch_id", "bytes_in", "bytes_out", "outcome"), (None, "", 0, 0, "")),
    "bytes": (("bytes_in", "bytes_out", "outcome"), (10.0, "batch_9", 0, 0, "")),
    "outcome": (("outcome",), (10.0, "batch_9", 64, 2048, "")),
}
OLD_VALUES: dict[str, Any] = {
    "ttft_ms": None, "batch_id": "", "bytes_in": 0, "bytes_out": 0, "outcome": "",
}  # fmt: skip


@pytest.fixture(params=list(LACKED), ids=[f"before-{name}" for name in LACKED])
def old_file(request: pytest.FixtureRequest, tmp_path: Path) -> OldFile:
    """A ledger file as a gateway wrote it before `ttft_ms` (and what came after it),
    before the bytes, or before the outcome (with the bytes): one record, an MCP call
    that timed out, in a batch."""
    lacked, read_as = LACKED[request.param]
    path = tmp_path / "old.db"
    columns = [name for name in COLUMNS if name not in lacked]
    record = mcp_call(1, "timeout", ttft_ms=10.0, batch_id="batch_9", bytes_in=64, bytes_out=2048)
    with sqlite3.connect(path) as connection:
        connection.execute(f"CREATE TABLE usage_ledger ({', '.join(columns)})")
        old = [getattr(record, name) for name in columns]
        connection.execute(f"INSERT INTO usage_ledger VALUES ({', '.join('?' * len(old))})", old)
    return OldFile(path, replace(record, **{name: OLD_VALUES[name] for name in lacked}), read_as)


def test_a_url_names_its_store(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/usage.db")
    assert isinstance(store, SqliteLedger)
    assert store.path == tmp_path / "usage.db"
    with pytest.raises(ValueError):
        open_store("mysql://db/usage")


async def test_a_report_and_a_key_s_requests_of_one_tenant_hold_only_its_records(
    store: SqliteLedger,
) -> None:
    # Issue 40: what a tenant's own admin reads of the ledger.
    records = [sample(i) for i in range(60)]
    await store.write(records)
    acme = [r for r in records if r.tenant == "acme"]
    rows = await store.query(ReportQuery(T0, T0 + 100, ("tenant", "key"), tenant="acme"))
    assert rows == expected_report(acme, T0, T0 + 100, ("tenant", "key"))
    assert {row["tenant"] for row in rows} == {"acme"}
    (total,) = await store.query(ReportQuery(T0, T0 + 100, tenant="acme"))
    assert total["requests"] == len(acme)
    listed = await store.requests(RequestsQuery("k1", T0, T0 + 100, tenant="acme"))
    assert listed and all(r.tenant == "acme" and r.key_id == "k1" for r in listed)
    assert await store.requests(RequestsQuery("k1", T0, T0 + 100, tenant="nobody")) == []


async def test_a_report_reads_a_file_from_before_the_newer_columns_without_changing_it(
    old_file: OldFile,
) -> None:
    path, old, (_, batch_id, bytes_in, bytes_out, outcome) = old_file
    before = path.read_bytes()
    reader = SqliteLedger(path, read_only=True)
    try:
        rows = await reader.query(ReportQuery(T0, T0 + 10, ("batch",)))
        by_outcome = await reader.query(ReportQuery(T0, T0 + 10, ("endpoint", "outcome")))
        listed = await reader.requests(RequestsQuery("k2", T0, T0 + 10))
    finally:
        await reader.close()
    assert [(row["batch"], row["requests"], row["bytes_in"], row["bytes_out"]) for row in rows] == [
        (batch_id, 1, bytes_in, bytes_out)
    ]
    assert rows == expected_report([old], T0, T0 + 10, ("batch",))
    # Its outcome "": not counted an error (a call that timed out, its status 200).
    assert [(r["endpoint"], r["outcome"], r["requests"], r["errors"]) for r in by_outcome] == [
        ("mcp", "", 1, 0)
    ]
    assert by_outcome == expected_report([old], T0, T0 + 10, ("endpoint", "outcome"))
    assert listed == [old]
    assert [(r.request_id, r.batch_id, r.bytes_in, r.bytes_out, r.outcome) for r in listed] == [
        ("r-1", batch_id, bytes_in, bytes_out, outcome)
    ]
    assert path.read_bytes() == before


@pytest.mark.parametrize(
    "by",
    [("endpoint",), ("tenant", "model"), ("key", "endpoint"), (), ("outcome",),
     ("endpoint", "outcome"), ("model", "outcome")],
)  # fmt: skip
async def test_an_mcp_call_s_bytes_are_stored_and_summed_per_group(
    store: SqliteLedger, by: tuple[str, ...]
) -> None:
    records = with_mcp_calls(60)
    await store.write(records)
    calls = [record for record in records if record.endpoint == "mcp"]
    # Every call sent carries its bytes; the one over its rate was never sent.
    sent = [record for record in calls if record.outcome != "rate_limited"]
    assert len(sent) == len(calls) - 1
    assert all(record.bytes_in and record.bytes_out for record in sent)
    # Each record read back as written, its bytes with it.
    listed = await store.requests(RequestsQuery("k1", T0, T0 + 60, limit=1000))
    assert listed == [record for record in records if record.key_id == "k1"]
    rows = await store.query(ReportQuery(T0, T0 + 60, by))
    assert rows == expected_report(records, T0, T0 + 60, by)
    if by == ("endpoint",):
        assert [(row["endpoint"], row["bytes_in"], row["bytes_out"]) for row in rows] == [
            ("chat", 0, 0),
            ("mcp", sum(r.bytes_in for r in calls), sum(r.bytes_out for r in calls)),
            ("responses", 0, 0),
        ]


async def test_each_outcome_is_stored_and_read_back(store: SqliteLedger) -> None:
    # Each way an MCP call ends, a refusal's reason, and "" for a request served.
    outcomes = [*MCP_OUTCOMES, "rate_requests", ""]
    records = [
        mcp_call(2 * i, outcome) if outcome in MCP_OUTCOMES else sample(2 * i, outcome=outcome)
        for i, outcome in enumerate(outcomes)
    ]
    records[-2].status = 429  # refused for its rate
    assert await store.write(records) == len(records)
    with sqlite3.connect(store.path) as connection:
        stored = connection.execute("SELECT outcome FROM usage_ledger ORDER BY ts").fetchall()
    assert [outcome for (outcome,) in stored] == outcomes
    listed = await store.requests(RequestsQuery("k1", T0, T0 + 100, limit=100))
    assert listed == records
    assert [record.outcome for record in listed] == outcomes


async def test_errors_count_the_mcp_calls_that_failed_though_answered_200(
    store: SqliteLedger,
) -> None:
    records = calls_that_ended_each_way()
    await store.write(records)
    rows = await store.query(ReportQuery(T0, T0 + 100, ("endpoint", "outcome")))
    assert [(r["endpoint"], r["outcome"], r["requests"], r["errors"]) for r in rows] == [
        ("chat", "", 1, 0),  # served
        ("mcp", "blocked", 1, 1),
        ("mcp", "error", 1, 1),
        ("mcp", "malformed", 1, 1),
        ("mcp", "ok", 1, 0),
        ("mcp", "rate_limited", 1, 1),  # by its status
        ("mcp", "refused", 1, 1),
        ("mcp", "timeout", 1, 1),
        ("mcp", "too_large", 1, 1),
        ("mcp", "tool_error", 1, 0),
        ("mcp", "unavailable", 1, 1),
        ("responses", "rate_requests", 1, 1),  # by its status
    ]
    assert rows == expected_report(records, T0, T0 + 100, ("endpoint", "outcome"))
    (total,) = await store.query(ReportQuery(T0, T0 + 100))
    assert (total["requests"], total["errors"]) == (12, sum(COUNTED.values()) + 1)


@pytest.mark.parametrize(
    ("outcome", "errors"), [("timeout", 1), ("refused", 1), ("ok", 0), ("tool_error", 0)]
)
async def test_one_mcp_call_answered_200_is_an_error_by_its_outcome(
    store: SqliteLedger, outcome: str, errors: int
) -> None:
    call = mcp_call(2, outcome)
    assert call.status == 200
    await store.write([call])
    (total,) = await store.query(ReportQuery(T0, T0 + 10))
    assert (total["requests"], total["errors"]) == (1, errors)
