"""Why the ledger cannot be read: what a store opened to read only (a report) raises."""

from __future__ import annotations

from pathlib import Path


class LedgerUnavailable(Exception):
    """The ledger cannot be read: a database that does not answer, a file or a database
    that holds no ledger. `str()` is one line saying why, for the user."""


class LedgerMissing(LedgerUnavailable):
    """No SQLite ledger at `path`: the file does not exist (a reader creates none; the
    gateway makes it with its first usage record)."""

    def __init__(self, path: Path) -> None:
        super().__init__(f"no usage ledger at {path}")
        self.path = path
