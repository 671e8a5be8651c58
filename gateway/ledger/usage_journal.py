"""The usage journal: every request that reached an upstream, on disk from then on.

The ledger's writer keeps records in memory until its next batch (up to
`flush_interval_ms`): a process killed in between lost them, and a request in flight when
it died had no record at all (issue 40: 2 of 264 answered requests and all 8 streams cut
by a `kill -9`). The journal closes both gaps. A request writes a line when it is
dispatched (`in_flight`, status 0), again as its usage builds up (a stream every 16
tokens; a whole answer once settled, before it is sent), and its final
record when it ends (`finished`). The lines of one turn of the event loop go out in one
`write(2)` at its end (under load, one system call for dozens of requests), except a
whole answer's, written at once, before the answer is: once a client has its answer,
its record is on disk. Not synced: the page cache outlives the process, so any crash of
the process keeps every line written (a crash of the machine is another matter: the
spool's `fsync` at close and the database's own durability cover the rest, as before).

A process that starts reads what the one before it left (`recover`): every final record
again (the ledger's store skips a request id it has: none is written twice), and for each
request that was in flight and never finished, its last line, as a record of what it had
used by then, with status `CUT_BY_EXIT`. Once the writer has delivered every final record
(to the database or the spool), `compact` replaces the files with one holding only the
requests still in flight, so the journal stays about the size of what is running.

Lines are JSON: `["i", row]` (in flight) or `["f", row]` (final), `row` a record's values
in `COLUMNS` order. Files are `journal-<seq>.jsonl` in the spool's directory, which the
spool's lock holds for one process.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import Iterable
from pathlib import Path

import orjson

from gateway.ledger.usage_records import UsageRecord, clean_row, from_row

log = logging.getLogger("gateway.ledger")

# The status a request's record carries when the process ended while it was in flight:
# the gateway's own failure (its client got no end to its answer).
CUT_BY_EXIT = 500
# Past this size the journal is compacted after a delivery.
COMPACT_BYTES = 4 * 1024 * 1024

_NAME = re.compile(r"^journal-(\d{10})\.jsonl$")
_IN_FLIGHT = b'["i",'
_FINAL = b'["f",'


class UsageJournal:
    """Usage records of the requests in flight, and of those finished and not yet
    delivered, appended to files in `directory`."""

    def __init__(self, directory: str | Path, compact_bytes: int = COMPACT_BYTES) -> None:
        self.directory = Path(directory)
        self._compact_bytes = compact_bytes
        # The requests in flight: each one's last line.
        self._in_flight: dict[str, bytes] = {}
        self._files: list[Path] = []
        self._fd = -1
        self._next = 0
        self.size = 0
        # Lines that could not be written (counted, logged).
        self.failures = 0
        # Lines of this turn of the event loop, written at its end.
        self._pending: list[bytes] = []

    def recover(self) -> list[UsageRecord]:
        """What the last process left: the final records, and a record for each request
        it had in flight (status `CUT_BY_EXIT`), in the order they were written. The
        files stay until `compact` (after these are delivered). Call it before the first
        line is written."""
        self.directory.mkdir(parents=True, exist_ok=True)
        found = sorted(
            (int(match.group(1)), path)
            for path in self.directory.iterdir()
            if (match := _NAME.match(path.name))
        )
        self._files = [path for _, path in found]
        self._next = found[-1][0] + 1 if found else 0
        latest: dict[str, tuple[bool, UsageRecord]] = {}
        unreadable = 0
        for path in self._files:
            for line in path.read_bytes().splitlines():
                try:
                    kind, row = orjson.loads(line)
                    record = from_row(row)
                except (orjson.JSONDecodeError, ValueError, TypeError):
                    unreadable += 1  # cut short by the process's end while written
                    continue
                seen = latest.get(record.request_id)
                if seen is None or not seen[0]:  # a final line is the last word
                    latest[record.request_id] = (kind == "f", record)
        if unreadable:
            log.error("usage journal: %d unreadable lines left out", unreadable)
        recovered = []
        cut = 0
        for final, record in latest.values():
            if not final:
                record.status = CUT_BY_EXIT
                cut += 1
            recovered.append(record)
        if recovered:
            log.warning(
                "usage journal: %d records recovered from the last process (%d of them in "
                "flight when it ended)",
                len(recovered),
                cut,
            )
        return recovered

    def in_flight(self, record: UsageRecord, *, now: bool = False) -> None:
        """A request in flight, as far as it has got (a later line replaces it); on
        disk by the end of this turn of the event loop, or before this returns (`now`:
        an answer about to be sent)."""
        line = _line(_IN_FLIGHT, record)
        self._in_flight[record.request_id] = line
        self._add(line)
        if now:
            self.write_pending()

    def finished(self, record: UsageRecord) -> None:
        """A request's final record."""
        self._in_flight.pop(record.request_id, None)
        self._add(_line(_FINAL, record))

    def write_pending(self) -> None:
        """Write the lines waiting for the end of this turn of the event loop."""
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            self._append(data)

    def _add(self, line: bytes) -> None:
        if not self._pending:
            try:
                asyncio.get_running_loop().call_soon(self.write_pending)
            except RuntimeError:  # no loop (a tool, a test): at once
                self._append(line)
                return
        self._pending.append(line)

    @property
    def due(self) -> bool:
        """Whether the files have grown enough to be compacted."""
        return self.size >= self._compact_bytes or len(self._files) > 1

    def compact(self, undelivered: Iterable[UsageRecord]) -> None:
        """Replace the files with one holding the requests in flight and the final
        records not yet delivered (`undelivered`): the writer calls it once everything
        else is in the database or the spool."""
        self._pending.clear()  # each is in flight still, or undelivered: written below
        lines = list(self._in_flight.values())
        lines += [_line(_FINAL, record) for record in undelivered]
        old = self._files
        self._close()
        self._files = []
        self.size = 0
        if lines:
            self._append(b"".join(lines))
        for path in old:
            path.unlink(missing_ok=True)

    def close(self) -> None:
        """Close the file (its lines stay for the next process, if any are owed)."""
        self.write_pending()
        self._close()

    def _append(self, data: bytes) -> None:
        # One write of a few hundred bytes to the page cache: a few microseconds.
        try:
            if self._fd < 0:
                path = self.directory / f"journal-{self._next:010d}.jsonl"
                self._next += 1
                self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                self._files.append(path)
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError as error:
            # A full or lost disk: the records still go to the writer's memory, as they
            # did before the journal; only a crash now would lose them.
            self.failures += 1
            if self.failures == 1 or self.failures % 10_000 == 0:
                log.error("usage journal: cannot write (%s); %d lines lost", error, self.failures)
            return
        self.size += len(data)

    def _close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _line(kind: bytes, record: UsageRecord) -> bytes:
    row = record.row()
    try:
        values = orjson.dumps(row)
    except orjson.JSONEncodeError:  # a count past 64 bits
        values = orjson.dumps(clean_row(row))
    return kind + values + b"]\n"
