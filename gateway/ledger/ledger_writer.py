"""The ledger's writer: a record per request taken in O(1), written later, in batches.

`record()` is what the request path calls: it adds a line to the journal (written to
the page cache at the end of the event loop's turn) and the record to a deque, and
returns, never awaiting and never touching the network. A background task takes the records
every `flush_interval_ms` (sooner when `batch_max` are waiting) and writes them to the
store in batches. When the store fails or takes longer than `write_timeout_ms` (the
database is down), the batch goes to the on-disk spool, and so does every batch after it,
so that records reach the database in the order they were made; the spool is replayed
once the database answers again (tried after a backoff of 0.5 s doubling to 10 s).
A batch half-written before a failure is written again whole: the request id is the
table's key, and a record already stored is skipped.

What waits in memory is also in the journal (`usage_journal.py`), with the requests in
flight: a process that dies (`kill -9`, an OOM kill) leaves it on disk, and the next one
started on the same spool directory delivers it, with a record for each request that was
in flight (status 500, its usage as far as it had got).

Records are lost only when the database is down and the disk cannot take them, each
counted (`LedgerStats.dropped`) and logged as an error: the spool is full
(`spool_max_bytes`) or cannot be written (a full disk); `buffer_max` records already wait
in memory (the flusher could not keep up even by spooling: a stuck disk; the journal
still holds them for the next process); a spooled line
cannot be read back (cut short when a process died while writing it). And a record made
after `close()` is not taken (counted too).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gateway.config.ledger_config import LedgerConfig
from gateway.ledger.ledger_store import LedgerStore, open_store
from gateway.ledger.usage_journal import UsageJournal
from gateway.ledger.usage_records import UsageRecord
from gateway.ledger.usage_spool import UsageSpool

log = logging.getLogger("gateway.ledger")

BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 10.0
# The loss of records is logged at most this often (with the running total).
DROP_LOG_INTERVAL_S = 10.0


@dataclass(frozen=True, slots=True)
class LedgerStats:
    """The writer's state, for metrics: counts since it started."""

    buffered: int  # in memory, waiting for the next batch
    spooled: int  # on disk, waiting for the database
    spool_bytes: int
    written: int  # in the database (a replayed duplicate counted once more)
    dropped: int  # lost: spool full or unwritable, memory full, unreadable, after close()
    lag_s: float  # age of the oldest record not yet in the database
    store_down: bool  # the last write failed; the next is tried after a backoff


class LedgerWriter:
    """Takes usage records on the request path and writes them to `store` in batches.

    `report`, if given, is called with the writer's `LedgerStats` after each flush (once
    per `flush_interval_ms` at most, never on the request path): the metrics it feeds are
    the caller's. Call `start()` in the event loop before the first record, and `close()`
    at shutdown. The writer owns the store and closes it.
    """

    def __init__(
        self,
        store: LedgerStore,
        spool_dir: str | Path,
        *,
        spool_max_bytes: int = 256 * 1024 * 1024,
        batch_max: int = 500,
        flush_interval_ms: int = 1000,
        buffer_max: int = 200_000,
        write_timeout_ms: int = 5000,
        report: Callable[[LedgerStats], None] | None = None,
    ) -> None:
        self.store = store
        self.spool = UsageSpool(spool_dir, spool_max_bytes)
        # Every record on disk from the moment it is taken, and the requests in flight:
        # what a crash of this process would lose is there for the next one.
        self.journal = UsageJournal(spool_dir)
        self._batch_max = batch_max
        self._interval_s = flush_interval_ms / 1000
        self._buffer_max = buffer_max
        self._write_timeout_s = write_timeout_ms / 1000
        self._report = report
        self._buffer: deque[UsageRecord] = deque()
        self._wake = asyncio.Event()
        # One flush at a time (the flusher's, `flush()`'s, `close()`'s): the spool is
        # appended and replayed by one task, in order.
        self._flushing = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._written = 0
        self._dropped = 0
        # Records refused by `record()` itself, counted there and logged by the flusher.
        self._refused = 0
        self._logged_drops = 0
        self._last_drop_log = -DROP_LOG_INTERVAL_S
        self._down = False
        self._retry_at = 0.0
        self._backoff_s = BACKOFF_FIRST_S

    # The request path.

    def in_flight(self, record: UsageRecord, *, now: bool = False) -> None:
        """A request in flight, as far as it has got: in the journal only, so that it has
        a record if this process ends before it does. O(1); on disk by the end of this
        turn of the event loop, or at once (`now`)."""
        if not self._closed:
            self.journal.in_flight(record, now=now)

    def record(self, record: UsageRecord) -> None:
        """Take one record: O(1), never blocks (a line for the journal, then memory).
        Call it on the writer's event loop."""
        if self._closed:
            self._refused += 1
            return
        self.journal.finished(record)
        buffer = self._buffer
        if len(buffer) >= self._buffer_max:
            self._refused += 1  # in the journal still: the next process delivers it
            return
        buffer.append(record)
        if len(buffer) == self._batch_max:
            self._wake.set()

    # Off the request path.

    async def start(self) -> None:
        """Find what a previous process spooled, and start the flusher."""
        await asyncio.to_thread(self.spool.load)
        # The journal's directory is the spool's, which `load` has locked for this process.
        self._buffer.extend(await asyncio.to_thread(self.journal.recover))
        if self.spool.records:
            log.warning(
                "usage ledger: %d records spooled in %s, to be replayed",
                self.spool.records,
                self.spool.directory,
            )
        self._task = asyncio.create_task(self._run(), name="usage-ledger-flusher")

    def stats(self) -> LedgerStats:
        """The writer's counts and lag now."""
        oldest = self.spool.oldest_ts
        if oldest is None and self._buffer:
            oldest = self._buffer[0].ts
        return LedgerStats(
            buffered=len(self._buffer),
            spooled=self.spool.records,
            spool_bytes=self.spool.size,
            written=self._written,
            dropped=self._dropped + self._refused + self.spool.unreadable,
            lag_s=max(0.0, time.time() - oldest) if oldest is not None else 0.0,
            store_down=self._down,
        )

    async def flush(self) -> None:
        """Write (or spool) every record taken so far, and replay the spool if the store
        is due to be tried."""
        await self._flush_once()

    async def close(self) -> None:
        """Stop taking records, write every waiting record to the store (or the spool,
        if it fails: the next process replays it), then close the store."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        if self._task is not None:
            await self._task
            self._task = None
        try:
            async with self._flushing:
                while self._buffer:
                    await self._deliver(self._take())
                # Delivered: the journal keeps only requests still in flight, if any.
                self.journal.compact(())
        finally:
            self.journal.close()
            await asyncio.to_thread(self.spool.close)
            self._log_drops(force=True)
            self._send_report()
            await self.store.close()

    async def _run(self) -> None:
        while not self._closed:
            if len(self._buffer) < self._batch_max:
                try:
                    async with asyncio.timeout(self._interval_s):
                        await self._wake.wait()
                except TimeoutError:
                    pass
            self._wake.clear()
            if self._closed:
                return
            try:
                await self._flush_once()
            except Exception:
                # A bug or a full disk must not end the flusher: records keep being
                # taken, and the next round tries again.
                log.exception("usage ledger: flush failed")

    async def _flush_once(self) -> None:
        async with self._flushing:
            # What waits now, and no more: records made while a batch is on its way wait
            # for the next round (or a full batch). Draining until the deque is empty sent
            # batches of the few records made during each write: hundreds of round trips
            # a second instead of a few.
            waiting = len(self._buffer)
            while waiting > 0:
                batch = self._take(waiting)
                waiting -= len(batch)
                await self._deliver(batch)
            if self.spool.records and self._store_due():
                await self._replay()
            if self.journal.due:
                # Every record taken before this round is delivered (to the database or
                # the spool): the journal keeps the requests in flight and the records
                # taken since.
                self.journal.compact(self._buffer)
            self._log_drops()
            self._send_report()

    def _take(self, most: int | None = None) -> list[UsageRecord]:
        """The oldest records, a batch of them at most (and at most `most`)."""
        buffer = self._buffer
        count = min(self._batch_max, len(buffer) if most is None else most)
        if count >= len(buffer):
            batch = list(buffer)
            buffer.clear()
            return batch
        return [buffer.popleft() for _ in range(count)]

    async def _deliver(self, batch: list[UsageRecord]) -> None:
        # While anything is spooled, or the store is down, new batches queue behind it.
        if self.spool.records or not self._store_due():
            await self._to_spool(batch)
            return
        try:
            await self._write(batch)
        except Exception as error:  # whatever the driver raises: the database failed
            self._store_failed(error)
            await self._to_spool(batch)

    async def _write(self, batch: list[UsageRecord]) -> None:
        async with asyncio.timeout(self._write_timeout_s):
            await self.store.write(batch)
        self._written += len(batch)
        if self._down:
            self._down = False
            log.warning("usage ledger: the database answers again")
        self._backoff_s = BACKOFF_FIRST_S

    def _store_due(self) -> bool:
        return not self._down or time.monotonic() >= self._retry_at

    def _store_failed(self, error: Exception) -> None:
        if not self._down:
            log.warning(
                "usage ledger: the database failed (%s: %s); records go to the spool in %s",
                type(error).__name__,
                error,
                self.spool.directory,
            )
        self._down = True
        self._retry_at = time.monotonic() + self._backoff_s
        self._backoff_s = min(self._backoff_s * 2, BACKOFF_MAX_S)

    async def _to_spool(self, batch: list[UsageRecord]) -> None:
        data, kept = self.spool.encode(batch)
        refused = len(batch) - kept
        if kept:
            try:
                await asyncio.to_thread(self.spool.write, data, kept, batch[0].ts)
            except OSError as error:
                # The disk is full or gone: the batch has nowhere left to go.
                log.error("usage ledger: the spool cannot be written (%s)", error)
                refused = len(batch)
        if refused:
            self._dropped += refused
            self._log_drops()

    async def _replay(self) -> None:
        """The spool into the store, oldest first, until it is empty or the store fails."""
        while (segment := self.spool.oldest()) is not None:
            lines = await asyncio.to_thread(self.spool.lines, segment)
            for start in range(0, len(lines), self._batch_max):
                # Parsed here, a batch at a time, between the requests' turns.
                records = self.spool.parse(lines[start : start + self._batch_max])
                try:
                    await self._write(records)
                except Exception as error:
                    # The file stays; the part written is skipped by its keys next time.
                    self._store_failed(error)
                    return
            await asyncio.to_thread(self.spool.remove, segment)
            if self._closed:
                return  # shutting down: the rest waits for the next process
            # Records made meanwhile go behind the spool, not to memory without bound.
            while len(self._buffer) >= self._batch_max:
                await self._to_spool(self._take())
        log.warning("usage ledger: the spool is replayed")

    def _log_drops(self, *, force: bool = False) -> None:
        dropped = self._dropped + self._refused
        if dropped == self._logged_drops:
            return
        now = time.monotonic()
        if not force and now - self._last_drop_log < DROP_LOG_INTERVAL_S:
            return
        log.error(
            "usage ledger: %d usage records LOST (%d in all): the database is down and "
            "the spool is full or cannot be written (%d of %d bytes in %s), "
            "or %d records already wait in memory",
            dropped - self._logged_drops,
            dropped,
            self.spool.size,
            self.spool.max_bytes,
            self.spool.directory,
            len(self._buffer),
        )
        self._logged_drops = dropped
        self._last_drop_log = now

    def _send_report(self) -> None:
        if self._report is not None:
            try:
                self._report(self.stats())
            except Exception:
                log.exception("usage ledger: reporting its state failed")


async def start_ledger(
    config: LedgerConfig, report: Callable[[LedgerStats], None] | None = None
) -> LedgerWriter:
    """The writer for the `ledger:` configuration, started."""
    writer = LedgerWriter(
        open_store(config.url),
        config.spool_dir,
        spool_max_bytes=config.spool_max_bytes,
        batch_max=config.batch_max,
        flush_interval_ms=config.flush_interval_ms,
        buffer_max=config.buffer_max,
        write_timeout_ms=config.write_timeout_ms,
        report=report,
    )
    await writer.start()
    return writer
