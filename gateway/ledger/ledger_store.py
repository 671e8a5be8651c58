"""What the ledger writes to: one small interface, PostgreSQL or SQLite behind it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gateway.config.ledger_config import POSTGRES_SCHEMES, SQLITE_SCHEME
from gateway.ledger.usage_records import UsageRecord
from gateway.ledger.usage_report import ReportQuery, ReportRow
from gateway.ledger.usage_requests import RequestsQuery


class LedgerStore(Protocol):
    """A database of usage records, keyed by request id."""

    async def write(self, batch: Sequence[UsageRecord]) -> int:
        """Store a batch in one transaction; a record already stored (by its request id)
        is skipped, not stored twice. Returns how many were new. Raises when the database
        cannot be reached or refuses: then none of the batch is stored."""
        ...

    async def query(self, query: ReportQuery) -> list[ReportRow]:
        """The usage report's rows (`usage_report.report_columns`)."""
        ...

    async def requests(self, query: RequestsQuery) -> list[UsageRecord]:
        """One key's records (`usage_requests`), oldest first."""
        ...

    async def close(self) -> None:
        """Release connections and threads; the store is not used again."""
        ...


def open_store(url: str, *, read_only: bool = False) -> LedgerStore:
    """The store for `ledger.url`; it connects on its first use, so a database that is
    down when the gateway starts does not stop it (the writer spools meanwhile).

    `read_only` (a report): the store creates nothing (no SQLite file or directory, no
    table), and raises `errors.LedgerUnavailable` (`LedgerMissing`: no SQLite file) with
    one line for the user when it cannot read the ledger.
    """
    if url.startswith(POSTGRES_SCHEMES):
        from gateway.ledger.postgres_ledger import PostgresLedger

        return PostgresLedger(url, read_only=read_only)
    if url.startswith(SQLITE_SCHEME):
        from gateway.ledger.sqlite_ledger import SqliteLedger

        return SqliteLedger(url[len(SQLITE_SCHEME) :], read_only=read_only)
    raise ValueError("a ledger URL is postgresql://... or sqlite:///path")
