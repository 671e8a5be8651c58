"""The ledger's spool: usage records kept on disk while the database does not answer.

Files of JSON lines (one record a line, its values in `COLUMNS` order) in one directory,
named by a rising sequence number: records are appended to the newest, replayed from the
oldest, and a file is deleted once all of its records are in the database. The files
outlive the process: a gateway restarted during an outage replays what the last one left.

The spool is bounded by `max_bytes`: what does not fit is refused and counted, the one
place where the ledger loses records on purpose. Its methods block on the disk; the
writer calls them off the event loop, one at a time.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import orjson

from gateway.ledger.usage_records import UsageRecord, from_row

log = logging.getLogger("gateway.ledger")

_NAME = re.compile(r"^usage-(\d{10})\.jsonl$")
# A file this large is closed and a new one begun: a replay reads one file at a time.
SEGMENT_BYTES = 1024 * 1024


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

    def load(self) -> None:
        """Find the files a previous process left (created if absent)."""
        self.directory.mkdir(parents=True, exist_ok=True)
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
        lines = []
        size = self.size
        for record in batch:
            line = orjson.dumps(record.row()) + b"\n"
            if size + len(line) > self.max_bytes:
                break
            size += len(line)
            lines.append(line)
        if lines:
            segment = self._writable(batch[0].ts)
            data = b"".join(lines)
            assert self._open is not None
            self._open.write(data)
            # Flushed to the kernel at once: a process that dies keeps what it spooled
            # (a machine that dies may lose the last writes; a sync per batch would cost
            # a disk flush on every batch of an outage).
            self._open.flush()
            segment.records += len(lines)
            segment.size += len(data)
            self.records += len(lines)
            self.size += len(data)
            if segment.size >= self._segment_bytes:
                self.seal()
        return len(batch) - len(lines)

    def _writable(self, first_ts: float) -> Segment:
        if self._open is None:
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
        """The file's records in order. A line that cannot be read (cut short when a
        process died while writing it) is left out and logged."""
        records = []
        bad = 0
        for line in segment.path.read_bytes().splitlines():
            try:
                records.append(from_row(orjson.loads(line)))
            except (orjson.JSONDecodeError, ValueError, TypeError):
                bad += 1
        if bad:
            log.error("usage ledger: %d unreadable records in %s left out", bad, segment.path)
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
        """Close the open file, its writes synced to the disk."""
        if self._open is not None:
            self._open.flush()
            os.fsync(self._open.fileno())
            self.seal()


def _first_ts(data: bytes) -> float:
    try:
        return from_row(orjson.loads(data.split(b"\n", 1)[0])).ts
    except (orjson.JSONDecodeError, ValueError, TypeError):
        return 0.0
