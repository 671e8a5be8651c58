"""The ledger's spool: usage records kept on disk while the database does not answer.

Files of JSON lines (one record a line, its values in `COLUMNS` order) in one directory,
named by a rising sequence number: records are appended to the newest, replayed from the
oldest, and a file is deleted once all of its records are in the database. The files
outlive the process: a gateway restarted during an outage replays what the last one left.

The spool is bounded by `max_bytes`: what does not fit is refused and counted, the one
place where the ledger loses records on purpose. The methods that touch the disk
(`load`, `write`, `lines`, `remove`, `close`) block: the writer calls them in a thread,
one at a time; those that encode and parse (`encode`, `parse`) it calls on the event
loop, a batch at a time.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import orjson

from gateway.ledger.usage_records import UsageRecord, clean_row, from_row

log = logging.getLogger("gateway.ledger")

_NAME = re.compile(r"^usage-(\d{10})\.jsonl$")
# A file this large is closed and a new one begun: a replay reads one file at a time.
SEGMENT_BYTES = 1024 * 1024


class SpoolInUse(RuntimeError):
    """Another process (or writer) holds the spool directory."""


@dataclass(slots=True)
class Segment:
    """One spool file: its records, bytes, and the time of its first record."""

    path: Path
    records: int
    size: int
    first_ts: float


class UsageSpool:
    """Usage records on disk in `directory`, at most `max_bytes` of them."""

    def __init__(self, directory: str | Path, max_bytes: int) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self._segment_bytes = max(1, min(SEGMENT_BYTES, max_bytes // 4))
        self._segments: list[Segment] = []
        self._open: BinaryIO | None = None
        self._next = 0
        self.records = 0
        self.size = 0
        # Records left out of a replay because their line could not be read.
        self.unreadable = 0
        self._lock: BinaryIO | None = None

    def load(self) -> None:
        """Find the files a previous process left (created if absent), and take the
        directory: a second process given the same one (each gateway worker needs its
        own) is refused with `SpoolInUse`, rather than both writing the same files."""
        self.directory.mkdir(parents=True, exist_ok=True)
        lock = open(self.directory / ".lock", "ab")  # noqa: SIM115 - held while it lives
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise SpoolInUse(f"the usage spool {self.directory} is in use") from None
        self._lock = lock
        found = []
        for path in self.directory.iterdir():
            match = _NAME.match(path.name)
            if match:
                found.append((int(match.group(1)), path))
        found.sort()
        for _, path in found:
            data = path.read_bytes()
            lines = data.count(b"\n")
            first = _first_ts(data)
            self._segments.append(Segment(path, lines, len(data), first))
            self.records += lines
            self.size += len(data)
        self._next = found[-1][0] + 1 if found else 0

    @property
    def oldest_ts(self) -> float | None:
        """The time of the oldest record waiting here, None if there is none."""
        return self._segments[0].first_ts if self._segments else None

    def append(self, batch: Sequence[UsageRecord]) -> int:
        """Append the batch, as much of it as fits; returns how many records did not."""
        data, kept = self.encode(batch)
        if kept:
            self.write(data, kept, batch[0].ts)
        return len(batch) - kept

    def encode(self, batch: Sequence[UsageRecord]) -> tuple[bytes, int]:
        """The batch's lines, as many as fit beside what the spool holds, and how many.

        CPU only, no disk: the writer calls it on the event loop, a batch at a time (a
        thread encoding thousands of records would hold the GIL for milliseconds, and
        the event loop would wait for it)."""
        lines = []
        size = self.size
        for record in batch:
            row = record.row()
            try:
                line = orjson.dumps(row) + b"\n"
            except orjson.JSONEncodeError:  # a count past 64 bits
                line = orjson.dumps(clean_row(row)) + b"\n"
            if size + len(line) > self.max_bytes:
                break
            size += len(line)
            lines.append(line)
        return b"".join(lines), len(lines)

    def write(self, data: bytes, records: int, first_ts: float) -> None:
        """Append `encode`'s lines (`records` of them, the first made at `first_ts`)."""
        segment = self._writable(first_ts)
        assert self._open is not None
        self._open.write(data)
        # Flushed to the kernel at once: a process that dies keeps what it spooled (a
        # machine that dies may lose the last writes; a sync per batch would cost a disk
        # flush on every batch of an outage).
        self._open.flush()
        segment.records += records
        segment.size += len(data)
        self.records += records
        self.size += len(data)
        if segment.size >= self._segment_bytes:
            self.seal()

    def _writable(self, first_ts: float) -> Segment:
        if self._open is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            path = self.directory / f"usage-{self._next:010d}.jsonl"
            self._next += 1
            self._open = open(path, "ab")  # noqa: SIM115 - kept open across appends
            self._segments.append(Segment(path, 0, 0, first_ts))
        return self._segments[-1]

    def seal(self) -> None:
        """Close the file being appended to: the next append begins a new one."""
        if self._open is not None:
            self._open.close()
            self._open = None

    def oldest(self) -> Segment | None:
        """The oldest file, sealed first if it is the one being appended to."""
        if not self._segments:
            return None
        if len(self._segments) == 1:
            self.seal()
        return self._segments[0]

    def read(self, segment: Segment) -> list[UsageRecord]:
        """The file's records in order (`parse` of `lines`)."""
        return self.parse(self.lines(segment))

    def lines(self, segment: Segment) -> list[bytes]:
        """The file's lines, read from the disk."""
        return segment.path.read_bytes().splitlines()

    def parse(self, lines: Sequence[bytes]) -> list[UsageRecord]:
        """Lines' records, in order. A line that cannot be read (cut short when a process
        died while writing it) is left out, counted in `unreadable` and logged."""
        records = []
        bad = 0
        for line in lines:
            try:
                records.append(from_row(orjson.loads(line)))
            except (orjson.JSONDecodeError, ValueError, TypeError):
                bad += 1
        if bad:
            self.unreadable += bad
            log.error("usage ledger: %d unreadable spooled records left out", bad)
        return records

    def remove(self, segment: Segment) -> None:
        """Delete the (oldest) file: its records are in the database."""
        if self._segments and self._segments[0] is segment:
            if len(self._segments) == 1:
                self.seal()
            self._segments.pop(0)
            self.records -= segment.records
            self.size -= segment.size
            segment.path.unlink(missing_ok=True)

    def close(self) -> None:
        """Close the open file, its writes synced to the disk, and let the directory go."""
        if self._open is not None:
            self._open.flush()
            os.fsync(self._open.fileno())
            self.seal()
        if self._lock is not None:
            self._lock.close()  # the lock goes with the descriptor
            self._lock = None


def _first_ts(data: bytes) -> float:
    try:
        return from_row(orjson.loads(data.split(b"\n", 1)[0])).ts
    except (orjson.JSONDecodeError, ValueError, TypeError):
        return 0.0
