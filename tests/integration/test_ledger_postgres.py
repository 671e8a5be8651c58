"""The ledger on a real PostgreSQL (127.0.0.1:5432): each test in a database of its own,
dropped after. An outage is real: a TCP proxy that refuses or hangs, or the database
dropped and made again."""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
import pytest

from gateway.ledger.ledger_store import open_store
from gateway.ledger.ledger_writer import LedgerWriter
from gateway.ledger.postgres_ledger import InsertMethod, PostgresLedger
from gateway.ledger.sqlite_ledger import SqliteLedger
from gateway.ledger.usage_report import ReportQuery
from gateway.ledger.usage_requests import RequestsQuery
from loadtest.ledger_cost import TcpOutage
from tests.polling import wait_until
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

SERVER = os.environ.get("LEDGER_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432")
GROUPINGS = [
    (), ("tenant",), ("tenant", "key", "model"), ("endpoint", "model"), ("key",),
    ("requested", "model"), ("batch",), ("outcome",),
]  # fmt: skip


async def _admin() -> asyncpg.Connection:
    return await asyncpg.connect(f"{SERVER}/postgres", timeout=5)


@pytest.fixture(scope="session")
async def postgres() -> str:
    """The server; skipped without one, except in CI, where that fails."""
    try:
        connection = await _admin()
    except (OSError, asyncpg.PostgresError) as error:
        if os.environ.get("CI") == "true":
            pytest.fail(f"PostgreSQL is not running on {SERVER}: {error}")
        pytest.skip(f"no PostgreSQL on {SERVER}")
    await connection.close()
    return SERVER


class Database:
    """A database of the test's own: its name, and dropped or made again on demand."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def create(self) -> None:
        connection = await _admin()
        try:
            await connection.execute(f"CREATE DATABASE {self.name}")
        finally:
            await connection.close()

    async def drop(self) -> None:
        connection = await _admin()
        try:
            await connection.execute(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")
        finally:
            await connection.close()

    async def count(self) -> int:
        connection = await asyncpg.connect(f"{SERVER}/{self.name}")
        try:
            return int(await connection.fetchval("SELECT count(*) FROM usage_ledger"))
        finally:
            await connection.close()


@pytest.fixture
async def database(postgres: str) -> AsyncIterator[Database]:
    db = Database(f"ledger_test_{os.urandom(5).hex()}")
    await db.create()
    try:
        yield db
    finally:
        await db.drop()


@pytest.fixture
async def proxy() -> AsyncIterator[TcpOutage]:
    outage = TcpOutage(int(SERVER.rsplit(":", 1)[1]))
    await outage.restore()
    try:
        yield outage
    finally:
        await outage.cut()


async def _true(value: bool) -> bool:
    return value


@pytest.mark.parametrize("method", ["copy", "unnest", "executemany"])
async def test_each_insert_method_stores_a_batch_once(
    database: Database, method: InsertMethod
) -> None:
    store = PostgresLedger(f"{SERVER}/{database.name}", insert_method=method)
    try:
        first = await store.write([sample(i) for i in range(300)])
        again = await store.write([sample(i) for i in range(250, 400)])
        assert await store.count() == 400
    finally:
        await store.close()
    if method != "executemany":  # it cannot tell new records from skipped ones
        assert (first, again) == (300, 100)


async def test_a_record_postgres_refuses_is_stored_cleaned(database: Database) -> None:
    # A NUL in the model a client asked for, a count past 64 bits: the batch is stored,
    # not refused (and retried from the spool) forever.
    store = PostgresLedger(f"{SERVER}/{database.name}")
    try:
        odd = sample(1, model_requested="a\x00b", prompt_tokens=2**70)
        assert await store.write([sample(0), odd]) == 2
    finally:
        await store.close()
    connection = await asyncpg.connect(f"{SERVER}/{database.name}")
    try:
        stored = await connection.fetchrow(
            "SELECT prompt_tokens, model_requested FROM usage_ledger WHERE request_id = 'r-1'"
        )
    finally:
        await connection.close()
    assert tuple(stored) == (2**63 - 1, "ab")


async def test_a_record_is_stored_as_made(database: Database) -> None:
    store = open_store(f"{SERVER}/{database.name}")
    try:
        await store.write([sample(3, fallback="llama-8b", ts=T0 + 0.123456)])
    finally:
        await store.close()
    connection = await asyncpg.connect(f"{SERVER}/{database.name}")
    try:
        row = await connection.fetchrow(
            "SELECT *, extract(epoch FROM ts) AS epoch FROM usage_ledger"
        )
    finally:
        await connection.close()
    assert float(row["epoch"]) == pytest.approx(T0 + 0.123456, abs=1e-6)
    assert dict(row) | {"ts": None, "epoch": None} == {
        "request_id": "r-3",
        "ts": None,
        "epoch": None,
        "tenant": "acme",
        "key_id": "k2",
        "endpoint": "responses",
        "model_requested": "coder",
        "model_served": "llama-70b",
        "prompt_tokens": 103,
        "cached_tokens": 3,
        "completion_tokens": 23,
        "cost_micros": 1003,
        "latency_ms": 3.0,
        "status": 200,
        "fallback": "llama-8b",
        "ttft_ms": 30.0,
        "batch_id": "batch_1",
        "bytes_in": 0,
        "bytes_out": 0,
        "outcome": "",  # served
    }


async def test_each_outcome_is_stored_as_made(database: Database) -> None:
    # Each way an MCP call ends, a refusal's reason, and "" for a request served.
    outcomes = [*MCP_OUTCOMES, "rate_requests", ""]
    records = [
        mcp_call(2 * i, outcome) if outcome in MCP_OUTCOMES else sample(2 * i, outcome=outcome)
        for i, outcome in enumerate(outcomes)
    ]
    records[-2].status = 429  # refused for its rate
    store = PostgresLedger(f"{SERVER}/{database.name}")
    try:
        assert await store.write(records) == len(records)
        listed = await store.requests(RequestsQuery("k1", T0, T0 + 100, limit=100))
    finally:
        await store.close()
    connection = await asyncpg.connect(f"{SERVER}/{database.name}")
    try:
        stored = await connection.fetch(
            "SELECT request_id, status, bytes_in, bytes_out, outcome FROM usage_ledger ORDER BY ts"
        )
    finally:
        await connection.close()
    assert [tuple(row) for row in stored] == [
        (r.request_id, r.status, r.bytes_in, r.bytes_out, r.outcome) for r in records
    ]
    assert [row["outcome"] for row in stored] == outcomes
    assert listed == records


@pytest.mark.parametrize("by", GROUPINGS)
async def test_the_report_groups_and_sums_as_sqlite_does(
    database: Database, tmp_path: Path, by: tuple[str, ...]
) -> None:
    records = [sample(i) for i in range(200)]
    since, until = T0 + 17, T0 + 171
    query = ReportQuery(since, until, by)
    postgres = PostgresLedger(f"{SERVER}/{database.name}")
    sqlite = SqliteLedger(tmp_path / "usage.db")
    try:
        await postgres.write(records)
        await sqlite.write(records)
        rows = await postgres.query(query)
        assert rows == expected_report(records, since, until, by)
        assert rows == await sqlite.query(query)
    finally:
        await postgres.close()
        await sqlite.close()


async def test_one_keys_requests_come_as_sqlite_gives_them(
    database: Database, tmp_path: Path
) -> None:
    records = [sample(i, ts=T0 + i + 0.25) for i in range(120)]
    query = RequestsQuery("k1", T0 + 30, T0 + 90, limit=7)
    postgres = PostgresLedger(f"{SERVER}/{database.name}")
    sqlite = SqliteLedger(tmp_path / "usage.db")
    try:
        await postgres.write(records)
        await sqlite.write(records)
        listed = await postgres.requests(query)
        assert listed == await sqlite.requests(query)
    finally:
        await postgres.close()
        await sqlite.close()
    assert [record.request_id for record in listed] == [f"r-{i}" for i in range(30, 44, 2)]
    assert listed[1] == records[32]


async def test_one_tenant_s_report_and_requests_come_as_sqlite_gives_them(
    database: Database, tmp_path: Path
) -> None:
    # Issue 40: what a tenant's own admin reads of the ledger.
    records = [sample(i, ts=T0 + i + 0.25) for i in range(120)]
    report = ReportQuery(T0 + 10, T0 + 100, ("tenant", "key", "model"), tenant="globex")
    requests = RequestsQuery("k2", T0 + 10, T0 + 100, limit=9, tenant="globex")
    postgres = PostgresLedger(f"{SERVER}/{database.name}")
    sqlite = SqliteLedger(tmp_path / "usage.db")
    try:
        await postgres.write(records)
        await sqlite.write(records)
        rows = await postgres.query(report)
        assert rows == await sqlite.query(report)
        assert rows and {row["tenant"] for row in rows} == {"globex"}
        listed = await postgres.requests(requests)
        assert listed == await sqlite.requests(requests)
        assert listed and all(r.tenant == "globex" and r.key_id == "k2" for r in listed)
    finally:
        await postgres.close()
        await sqlite.close()


# The columns a ledger table had after `fallback`, before `ttft_ms` was added (none),
# before the bytes were and before the outcome was, the old record's values in them, and
# its (ttft_ms, batch_id, bytes_in, bytes_out, outcome) as read.
BEFORE = {
    "ttft": ("", "", (None, "", 0, 0, "")),
    "bytes": (
        ", ttft_ms double precision, batch_id text NOT NULL DEFAULT ''",
        ", 12.5, 'batch_9'",
        (12.5, "batch_9", 0, 0, ""),
    ),
    "outcome": (
        ", ttft_ms double precision, batch_id text NOT NULL DEFAULT '',"
        " bytes_in bigint NOT NULL DEFAULT 0, bytes_out bigint NOT NULL DEFAULT 0",
        ", 12.5, 'batch_9', 64, 2048",
        (12.5, "batch_9", 64, 2048, ""),
    ),
}


@pytest.mark.parametrize("before", list(BEFORE))
async def test_a_table_from_before_the_newer_columns_gets_them(
    database: Database, before: str
) -> None:
    columns, values, read_as = BEFORE[before]
    connection = await asyncpg.connect(f"{SERVER}/{database.name}")
    try:
        await connection.execute(
            "CREATE TABLE usage_ledger (request_id text PRIMARY KEY, ts timestamptz NOT NULL,"
            " tenant text NOT NULL, key_id text NOT NULL, endpoint text NOT NULL,"
            " model_requested text NOT NULL, model_served text NOT NULL,"
            " prompt_tokens bigint NOT NULL, cached_tokens bigint NOT NULL,"
            " completion_tokens bigint NOT NULL, cost_micros bigint NOT NULL,"
            " latency_ms double precision NOT NULL, status bigint NOT NULL,"
            f" fallback text NOT NULL{columns})"
        )
        await connection.execute(
            "INSERT INTO usage_ledger VALUES ('r-1', to_timestamp($1), 'acme', 'k2', 'chat',"
            f" 'coder', 'llama-8b', 1, 0, 1, 1, 1.0, 200, ''{values})",
            T0 + 1,
        )
    finally:
        await connection.close()
    store = PostgresLedger(f"{SERVER}/{database.name}")
    new = sample(3, bytes_in=250, bytes_out=9000, outcome="timeout")
    try:
        await store.write([new])
        listed = await store.requests(RequestsQuery("k2", T0, T0 + 10))
        rows = await store.query(ReportQuery(T0, T0 + 10, ("endpoint",)))
        outcomes = await store.query(ReportQuery(T0, T0 + 10, ("outcome",)))
    finally:
        await store.close()
    # The old record reads with what each column it lacked means (no time to first
    # token, no batch, no bytes, no outcome); the new one as written.
    assert [
        (r.request_id, r.ttft_ms, r.batch_id, r.bytes_in, r.bytes_out, r.outcome) for r in listed
    ] == [
        ("r-1", *read_as),
        ("r-3", 30.0, "batch_1", 250, 9000, "timeout"),
    ]
    assert listed[1] == new
    assert [(row["endpoint"], row["bytes_in"], row["bytes_out"]) for row in rows] == [
        ("chat", read_as[2], read_as[3]),
        ("responses", 250, 9000),
    ]
    # The old record's outcome "" (its status 200: no error); the new one's counts.
    assert [(row["outcome"], row["requests"], row["errors"]) for row in outcomes] == [
        ("", 1, 0),
        ("timeout", 1, 1),
    ]


@pytest.mark.parametrize(
    "by",
    [("endpoint",), ("tenant", "model"), ("key", "endpoint"), (), ("outcome",),
     ("endpoint", "outcome"), ("model", "outcome")],
)  # fmt: skip
async def test_an_mcp_call_s_bytes_are_stored_and_summed_as_sqlite_does(
    database: Database, tmp_path: Path, by: tuple[str, ...]
) -> None:
    records = with_mcp_calls(60)
    calls = [record for record in records if record.endpoint == "mcp"]
    query = ReportQuery(T0, T0 + 60, by)
    requests = RequestsQuery("k2", T0, T0 + 60, limit=1000)
    postgres = PostgresLedger(f"{SERVER}/{database.name}")
    sqlite = SqliteLedger(tmp_path / "usage.db")
    try:
        await postgres.write(records)
        await sqlite.write(records)
        # Each record read back as written, its bytes with it.
        listed = await postgres.requests(requests)
        assert listed == [record for record in records if record.key_id == "k2"]
        assert listed == await sqlite.requests(requests)
        rows = await postgres.query(query)
        assert rows == expected_report(records, T0, T0 + 60, by)
        assert rows == await sqlite.query(query)
    finally:
        await postgres.close()
        await sqlite.close()
    if by == ("endpoint",):
        assert [(row["endpoint"], row["bytes_in"], row["bytes_out"]) for row in rows] == [
            ("chat", 0, 0),
            ("mcp", sum(r.bytes_in for r in calls), sum(r.bytes_out for r in calls)),
            ("responses", 0, 0),
        ]


async def test_errors_count_the_mcp_calls_that_failed_as_sqlite_does(
    database: Database, tmp_path: Path
) -> None:
    records = calls_that_ended_each_way()
    postgres = PostgresLedger(f"{SERVER}/{database.name}")
    sqlite = SqliteLedger(tmp_path / "usage.db")
    try:
        await postgres.write(records)
        await sqlite.write(records)
        by_outcome = ReportQuery(T0, T0 + 100, ("outcome",))
        rows = await postgres.query(by_outcome)
        assert rows == await sqlite.query(by_outcome)
        totals = ReportQuery(T0, T0 + 100)
        (total,) = await postgres.query(totals)
        assert [total] == await sqlite.query(totals)
    finally:
        await postgres.close()
        await sqlite.close()
    # An MCP call that failed answered 200 all the same: its outcome makes it an error.
    assert {row["outcome"]: row["errors"] for row in rows} == {
        **COUNTED,
        "rate_requests": 1,  # refused, 429
        "": 0,  # served
    }
    assert rows == expected_report(records, T0, T0 + 100, ("outcome",))
    assert (total["requests"], total["errors"]) == (12, sum(COUNTED.values()) + 1)


@pytest.mark.parametrize(
    ("outcome", "errors"), [("timeout", 1), ("refused", 1), ("ok", 0), ("tool_error", 0)]
)
async def test_one_mcp_call_answered_200_is_an_error_by_its_outcome_as_in_sqlite(
    database: Database, tmp_path: Path, outcome: str, errors: int
) -> None:
    call = mcp_call(2, outcome)
    assert call.status == 200
    query = ReportQuery(T0, T0 + 10, ("endpoint",))
    postgres = PostgresLedger(f"{SERVER}/{database.name}")
    sqlite = SqliteLedger(tmp_path / "usage.db")
    try:
        await postgres.write([call])
        await sqlite.write([call])
        rows = await postgres.query(query)
        assert rows == await sqlite.query(query)
    finally:
        await postgres.close()
        await sqlite.close()
    assert [(row["endpoint"], row["requests"], row["errors"]) for row in rows] == [
        ("mcp", 1, errors)
    ]


async def test_an_outage_under_load_loses_nothing_and_slows_no_record(
    database: Database, proxy: TcpOutage, tmp_path: Path
) -> None:
    store = PostgresLedger(f"postgresql://postgres@127.0.0.1:{proxy.port}/{database.name}")
    writer = LedgerWriter(
        store, tmp_path / "spool", batch_max=100, flush_interval_ms=50, write_timeout_ms=1000
    )
    await writer.start()
    made = 0
    calls: list[float] = []
    prefix = os.urandom(4).hex()

    async def load(seconds: float) -> None:
        # About 2,000 requests a second, each making its record.
        nonlocal made
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for _ in range(20):
                record = sample(made, prefix)
                started = time.perf_counter()
                writer.record(record)
                calls.append(time.perf_counter() - started)
                made += 1
            await asyncio.sleep(0.01)

    await load(0.5)
    await proxy.cut()
    await load(2.0)
    assert writer.stats().store_down
    assert writer.stats().spooled > 0
    await proxy.restore()
    await load(1.0)
    await wait_until(lambda: _true(writer.stats().spooled == writer.stats().buffered == 0))
    await writer.close()
    assert await database.count() == made
    assert writer.stats().dropped == 0
    assert list((tmp_path / "spool").glob("*.jsonl")) == []
    # record() stayed an append throughout: its 99th percentile in microseconds.
    assert statistics.quantiles(calls, n=100)[98] < 50e-6


async def test_a_database_that_hangs_times_out_to_the_spool(
    database: Database, proxy: TcpOutage, tmp_path: Path
) -> None:
    proxy.hang = True
    store = PostgresLedger(f"postgresql://postgres@127.0.0.1:{proxy.port}/{database.name}")
    writer = LedgerWriter(store, tmp_path / "spool", batch_max=10, write_timeout_ms=200)
    await writer.start()
    for i in range(30):
        writer.record(sample(i))
    await wait_until(lambda: _true(writer.stats().spooled == 30))
    await proxy.cut()  # the hanging connections broken
    proxy.hang = False
    await proxy.restore()
    await wait_until(lambda: _true(writer.stats().spooled == 0), timeout_s=30)
    await writer.close()
    assert await database.count() == 30


async def test_a_database_dropped_and_made_again_gets_every_record(
    database: Database, tmp_path: Path
) -> None:
    writer = LedgerWriter(open_store(f"{SERVER}/{database.name}"), tmp_path / "spool", batch_max=10)
    await writer.start()
    for i in range(10):
        writer.record(sample(i))
    await writer.flush()
    assert await database.count() == 10
    await database.drop()
    for i in range(10, 40):
        writer.record(sample(i))
    await wait_until(lambda: _true(writer.stats().spooled == 30))
    await database.create()
    # The table is made again, then the spool replayed into it.
    await wait_until(lambda: _true(writer.stats().spooled == 0), timeout_s=30)
    await writer.close()
    assert await database.count() == 30


async def test_the_writer_starts_while_the_database_is_down(
    database: Database, proxy: TcpOutage, tmp_path: Path
) -> None:
    await proxy.cut()
    store = PostgresLedger(f"postgresql://postgres@127.0.0.1:{proxy.port}/{database.name}")
    writer = LedgerWriter(store, tmp_path / "spool", batch_max=10)
    await writer.start()
    for i in range(25):
        writer.record(sample(i))
    await wait_until(lambda: _true(writer.stats().spooled == 25))
    await proxy.restore()
    await wait_until(lambda: _true(writer.stats().spooled == 0), timeout_s=30)
    await writer.close()
    assert await database.count() == 25
