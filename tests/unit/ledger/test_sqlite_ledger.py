"""The SQLite store on a real file: batches, duplicates, the report."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gateway.ledger.ledger_store import open_store
from gateway.ledger.sqlite_ledger import SqliteLedger
from gateway.ledger.usage_records import COLUMNS, UsageRecord
from gateway.ledger.usage_report import ReportQuery
from gateway.ledger.usage_requests import RequestsQuery
from tests.unit.ledger.usage_samples import T0, expected_report, sample, with_mcp_calls

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
    await store.write([sample(7, fallback="llama-8b")])
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


async def test_a_file_from_before_the_newer_columns_gets_them(
    old_file: tuple[Path, UsageRecord],
) -> None:
    path, old = old_file
    store = SqliteLedger(path)
    try:
        await store.write([sample(3, bytes_in=250, bytes_out=9000)])
        listed = await store.requests(RequestsQuery("k2", T0, T0 + 10))
    finally:
        await store.close()
    with sqlite3.connect(path) as connection:
        columns = [row[1] for row in connection.execute("PRAGMA table_info(usage_ledger)")]
    assert columns == list(COLUMNS)  # the lacking ones added at the end, in order
    # The old record reads with what each column it lacked means: no time to first
    # token, no batch, no bytes; the new one as written.
    assert listed == [old, sample(3, bytes_in=250, bytes_out=9000)]
    assert [(r.ttft_ms, r.batch_id, r.bytes_in, r.bytes_out) for r in listed] == [
        (old.ttft_ms, old.batch_id, 0, 0),
        (30.0, "batch_1", 250, 9000),
    ]


# The columns a ledger file lacked before each was added, and what an old row means in it.
LACKED = {
    "ttft": ("ttft_ms", "batch_id", "bytes_in", "bytes_out"),
    "bytes": ("bytes_in", "bytes_out"),
}
OLD_VALUES: dict[str, Any] = {"ttft_ms": None, "batch_id": "", "bytes_in": 0, "bytes_out": 0}


@pytest.fixture(params=list(LACKED), ids=[f"before-{name}" for name in LACKED])
def old_file(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, UsageRecord]:
    """A ledger file as a gateway wrote it before `ttft_ms` (and what came after it), or
    before the bytes: one record, and that record as a reader should find it."""
    lacked = LACKED[request.param]
    path = tmp_path / "old.db"
    columns = [name for name in COLUMNS if name not in lacked]
    record = sample(1)
    with sqlite3.connect(path) as connection:
        connection.execute(f"CREATE TABLE usage_ledger ({', '.join(columns)})")
        old = [getattr(record, name) for name in columns]
        connection.execute(f"INSERT INTO usage_ledger VALUES ({', '.join('?' * len(old))})", old)
    return path, replace(record, **{name: OLD_VALUES[name] for name in lacked})


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
    old_file: tuple[Path, UsageRecord],
) -> None:
    path, old = old_file
    before = path.read_bytes()
    reader = SqliteLedger(path, read_only=True)
    try:
        rows = await reader.query(ReportQuery(T0, T0 + 10, ("batch",)))
        listed = await reader.requests(RequestsQuery("k2", T0, T0 + 10))
    finally:
        await reader.close()
    assert [(row["batch"], row["requests"], row["bytes_in"], row["bytes_out"]) for row in rows] == [
        ("", 1, 0, 0)
    ]
    assert rows == expected_report([old], T0, T0 + 10, ("batch",))
    assert listed == [old]
    assert [(r.request_id, r.batch_id, r.bytes_in, r.bytes_out) for r in listed] == [
        ("r-1", "", 0, 0)
    ]
    assert path.read_bytes() == before


@pytest.mark.parametrize("by", [("endpoint",), ("tenant", "model"), ("key", "endpoint"), ()])
async def test_an_mcp_call_s_bytes_are_stored_and_summed_per_group(
    store: SqliteLedger, by: tuple[str, ...]
) -> None:
    records = with_mcp_calls(60)
    await store.write(records)
    calls = [record for record in records if record.endpoint == "mcp"]
    assert calls and all(record.bytes_in and record.bytes_out for record in calls)
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
