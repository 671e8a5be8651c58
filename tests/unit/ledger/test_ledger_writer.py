"""The writer against a real SQLite store; an outage is a store that refuses (or hangs)."""

from __future__ import annotations

import asyncio
import inspect
import logging
import sqlite3
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from gateway.config.ledger_config import LedgerConfig
from gateway.ledger.ledger_writer import LedgerStats, LedgerWriter, start_ledger
from gateway.ledger.sqlite_ledger import SqliteLedger
from gateway.ledger.usage_records import UsageRecord
from gateway.ledger.usage_report import ReportQuery, ReportRow
from tests.polling import wait_until
from tests.unit.ledger.usage_samples import sample


class Outage:
    """A real store that can be taken down: it refuses, hangs, or writes then fails."""

    def __init__(self, store: SqliteLedger) -> None:
        self.store = store
        self.mode = "up"  # or "refuse", "hang", "ack_lost"
        self.batches: list[int] = []
        self.delay_s = 0.0  # each write's round trip
        self.hanging = asyncio.Event()  # set when a write starts to hang

    async def write(self, batch: Sequence[UsageRecord]) -> int:
        if self.mode == "refuse":
            raise ConnectionRefusedError("the database is down")
        if self.mode == "hang":
            self.hanging.set()
            await asyncio.sleep(3600)
        await asyncio.sleep(self.delay_s)
        written = await self.store.write(batch)
        self.batches.append(len(batch))
        if self.mode == "ack_lost":
            # Committed, but the answer never came: the writer must not store it twice.
            raise ConnectionResetError("connection lost after commit")
        return written

    async def query(self, query: ReportQuery) -> list[ReportRow]:
        return await self.store.query(query)

    async def close(self) -> None:
        await self.store.close()


@pytest.fixture
async def outage(tmp_path: Path) -> AsyncIterator[Outage]:
    store = Outage(SqliteLedger(tmp_path / "usage.db"))
    yield store
    if store.store._connection is not None:  # the writer did not close it
        await store.close()


async def _count(tmp_path: Path) -> int:
    reader = SqliteLedger(tmp_path / "usage.db")
    try:
        return await reader.count()
    finally:
        await reader.close()


def _writer(store: Outage, tmp_path: Path, **options: object) -> LedgerWriter:
    settings: dict[str, object] = {"batch_max": 10, "flush_interval_ms": 20}
    settings.update(options)
    return LedgerWriter(store, tmp_path / "spool", **settings)  # type: ignore[arg-type]


def test_record_is_a_plain_function() -> None:
    assert not inspect.iscoroutinefunction(LedgerWriter.record)


async def test_a_full_batch_is_written_at_once(outage: Outage, tmp_path: Path) -> None:
    # The interval is long: only a full batch wakes the flusher.
    writer = _writer(outage, tmp_path, flush_interval_ms=60_000)
    await writer.start()
    for i in range(9):
        assert writer.record(sample(i)) is None
    await asyncio.sleep(0.1)
    assert outage.batches == []
    assert writer.stats().buffered == 9
    writer.record(sample(9))
    await wait_until(lambda: _true(outage.batches == [10]))
    for i in range(10, 35):
        writer.record(sample(i))
    await wait_until(lambda: _true(sum(outage.batches) == 35))
    assert all(size <= 10 for size in outage.batches)
    await writer.close()
    assert await _count(tmp_path) == 35
    assert writer.stats().written == 35


async def _true(value: bool) -> bool:
    return value


async def test_records_made_during_a_write_wait_for_the_next_batch(
    outage: Outage, tmp_path: Path
) -> None:
    # Each write takes 10 ms while records keep coming: they gather into the next batch
    # rather than going out a few at a time, one write after another.
    outage.delay_s = 0.01
    writer = _writer(outage, tmp_path, batch_max=100, flush_interval_ms=100)
    await writer.start()
    for i in range(0, 500, 2):
        writer.record(sample(i))
        writer.record(sample(i + 1))
        await asyncio.sleep(0.002)
    await writer.close()
    assert sum(outage.batches) == 500
    assert len(outage.batches) <= 15, outage.batches


async def test_a_few_records_are_written_after_the_interval(outage: Outage, tmp_path: Path) -> None:
    writer = _writer(outage, tmp_path, batch_max=1000, flush_interval_ms=50)
    await writer.start()
    writer.record(sample(0))
    writer.record(sample(1))
    await wait_until(lambda: _true(outage.batches == [2]))
    await writer.close()


async def test_an_outage_spools_and_nothing_is_lost_or_doubled(
    outage: Outage, tmp_path: Path
) -> None:
    reports: list[LedgerStats] = []
    writer = _writer(outage, tmp_path, report=reports.append)
    await writer.start()
    for i in range(15):
        writer.record(sample(i))
    await wait_until(lambda: _true(writer.stats().written == 15))
    outage.mode = "refuse"
    for i in range(15, 60):
        writer.record(sample(i))
        if i % 10 == 0:
            await asyncio.sleep(0.03)
    await wait_until(lambda: _true(writer.stats().spooled == 45))
    stats = writer.stats()
    assert stats.store_down and stats.dropped == 0 and stats.lag_s > 0
    assert any(report.spooled for report in reports)
    outage.mode = "up"
    # Records made after it is back queue behind the spool, in order.
    for i in range(60, 70):
        writer.record(sample(i))
    await wait_until(lambda: _true(writer.stats().spooled == 0 and writer.stats().buffered == 0))
    assert not writer.stats().store_down
    await writer.close()
    assert await _count(tmp_path) == 70
    assert list((tmp_path / "spool").glob("*.jsonl")) == []
    assert writer.stats().dropped == 0


async def test_a_batch_written_but_not_acknowledged_is_stored_once(
    outage: Outage, tmp_path: Path
) -> None:
    writer = _writer(outage, tmp_path)
    await writer.start()
    outage.mode = "ack_lost"
    for i in range(10):
        writer.record(sample(i))
    await wait_until(lambda: _true(writer.stats().spooled == 10))
    outage.mode = "up"
    await wait_until(lambda: _true(writer.stats().spooled == 0))
    await writer.close()
    # The batch went to the database twice; its request ids kept it to one copy.
    assert sum(outage.batches) == 20
    assert await _count(tmp_path) == 10


async def test_a_hanging_database_counts_as_down(outage: Outage, tmp_path: Path) -> None:
    writer = _writer(outage, tmp_path, write_timeout_ms=100)
    await writer.start()
    outage.mode = "hang"
    for i in range(10):
        writer.record(sample(i))  # a full batch: the flusher takes it to the database
    await outage.hanging.wait()
    # Meanwhile the request path goes on: while that write hangs (no await since, so its
    # timeout cannot have run), record() takes every record and waits for nothing.
    for i in range(10, 20):
        writer.record(sample(i))
    stats = writer.stats()
    assert (stats.buffered, stats.dropped, stats.store_down) == (10, 0, False)
    await wait_until(lambda: _true(writer.stats().spooled == 20))
    outage.mode = "up"
    await wait_until(lambda: _true(writer.stats().spooled == 0))
    await writer.close()
    assert await _count(tmp_path) == 20


async def test_a_full_spool_drops_records_counted_and_logged(
    outage: Outage, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    outage.mode = "refuse"
    writer = _writer(outage, tmp_path, spool_max_bytes=4096)
    await writer.start()
    for i in range(100):
        writer.record(sample(i))
    with caplog.at_level(logging.ERROR, "gateway.ledger"):
        await writer.flush()
    stats = writer.stats()
    assert stats.dropped > 0
    assert stats.spooled + stats.dropped == 100
    assert stats.spool_bytes <= 4096
    assert "LOST" in caplog.text
    outage.mode = "up"
    await wait_until(lambda: _true(writer.stats().spooled == 0))
    await writer.close()
    # The oldest records were kept; only the newest were lost.
    assert await _count(tmp_path) == 100 - stats.dropped


async def test_a_spool_that_cannot_be_written_counts_its_records_lost(
    outage: Outage, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    outage.mode = "refuse"
    (tmp_path / "spool").write_text("a file where the directory should be")
    writer = LedgerWriter(outage, tmp_path / "spool" / "inner", batch_max=10)  # type: ignore[arg-type]
    for i in range(10):
        writer.record(sample(i))
    with caplog.at_level(logging.ERROR, "gateway.ledger"):
        await writer.flush()
    assert writer.stats().dropped == 10
    assert "cannot be written" in caplog.text
    await writer.close()


async def test_records_past_the_memory_bound_are_dropped(outage: Outage, tmp_path: Path) -> None:
    writer = _writer(outage, tmp_path, batch_max=100, buffer_max=5, flush_interval_ms=60_000)
    await writer.start()
    for i in range(8):
        writer.record(sample(i))
    assert writer.stats().buffered == 5
    assert writer.stats().dropped == 3
    await writer.close()
    assert await _count(tmp_path) == 5


async def test_close_writes_what_waits(outage: Outage, tmp_path: Path) -> None:
    writer = _writer(outage, tmp_path, batch_max=1000, flush_interval_ms=60_000)
    await writer.start()
    for i in range(30):
        writer.record(sample(i))
    await writer.close()
    assert await _count(tmp_path) == 30
    # Closed: a record made now is not taken, and counted.
    writer.record(sample(99))
    assert writer.stats().dropped == 1


async def test_close_while_down_spools_and_the_next_writer_replays(
    outage: Outage, tmp_path: Path
) -> None:
    writer = _writer(outage, tmp_path, batch_max=1000, flush_interval_ms=60_000)
    await writer.start()
    outage.mode = "refuse"
    for i in range(30):
        writer.record(sample(i))
    await writer.close()
    assert writer.stats().spooled == 30
    assert await _count(tmp_path) == 0
    # The next process, its database up.
    config = LedgerConfig(
        url=f"sqlite:///{tmp_path / 'usage.db'}",
        spool_dir=str(tmp_path / "spool"),
        flush_interval_ms=20,
    )
    again = await start_ledger(config)
    assert again.stats().spooled == 30
    await wait_until(lambda: _true(again.stats().spooled == 0))
    await again.close()
    assert await _count(tmp_path) == 30


async def test_a_process_killed_before_its_flush_loses_no_record(
    outage: Outage, tmp_path: Path
) -> None:
    """Issue 40: records waited in memory up to a flush interval, and a request in flight
    had no record at all, so a `kill -9` lost both. Now the journal has them: the next
    writer on the same spool directory stores every finished record once, and each
    request that was in flight with what it had used, as cut by the process's end."""
    writer = _writer(outage, tmp_path, batch_max=1000, flush_interval_ms=60_000)
    await writer.start()
    for i in range(20):
        writer.record(sample(i))
    writer.in_flight(sample(20, status=0, completion_tokens=128))
    await writer.flush()  # the first 20 are in the database...
    for i in range(21, 30):
        writer.record(sample(i))  # ...these 9 only in memory (and the journal)
    writer.in_flight(sample(30, status=0, completion_tokens=0))
    # The process dies: no close; the kernel lets its lock on the directory go.
    assert writer._task is not None
    writer._task.cancel()
    assert writer.spool._lock is not None
    writer.spool._lock.close()
    await outage.close()
    config = LedgerConfig(
        url=f"sqlite:///{tmp_path / 'usage.db'}",
        spool_dir=str(tmp_path / "spool"),
        flush_interval_ms=20,
    )
    again = await start_ledger(config)
    await again.close()
    assert await _count(tmp_path) == 31  # 0..30, each once
    with sqlite3.connect(tmp_path / "usage.db") as db:
        rows = dict(
            db.execute(
                "SELECT request_id, status || ':' || completion_tokens FROM usage_ledger"
                " WHERE request_id IN ('r-20', 'r-29', 'r-30')"
            ).fetchall()
        )
    assert rows == {"r-20": "500:128", "r-29": f"{sample(29).status}:49", "r-30": "500:0"}
