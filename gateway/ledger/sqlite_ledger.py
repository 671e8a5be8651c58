"""The ledger in an SQLite file: the embedded default, for the demo and one node.

An sqlite3 connection belongs to one thread and every call blocks, so the store has one
thread of its own: the event loop only awaits it. WAL mode lets reports read while a batch
is written, and lets several gateway processes on one machine share the file (their writes
take turns, `busy_timeout` long). Opened to read only (a report), the store makes nothing:
no directory, no file, no table; a file that is not there is `LedgerMissing`.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from gateway.ledger import usage_requests
from gateway.ledger.errors import LedgerMissing, LedgerUnavailable
from gateway.ledger.usage_records import COLUMNS, UsageRecord, clean_row, from_row
from gateway.ledger.usage_report import TABLE, ReportQuery, ReportRow, as_rows, sqlite_sql
from gateway.ledger.usage_requests import RequestsQuery

T = TypeVar("T")

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    request_id TEXT PRIMARY KEY,
    ts REAL NOT NULL,
    tenant TEXT NOT NULL,
    key_id TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    model_requested TEXT NOT NULL,
    model_served TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    cached_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    cost_micros INTEGER NOT NULL,
    latency_ms REAL NOT NULL,
    status INTEGER NOT NULL,
    fallback TEXT NOT NULL,
    ttft_ms REAL,
    batch_id TEXT NOT NULL DEFAULT '',
    bytes_in INTEGER NOT NULL DEFAULT 0,
    bytes_out INTEGER NOT NULL DEFAULT 0,
    outcome TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS {TABLE}_ts ON {TABLE} (ts);
CREATE INDEX IF NOT EXISTS {TABLE}_key_ts ON {TABLE} (key_id, ts);
"""
# A file made before `ttft_ms` was recorded gets the column (its old rows: NULL).
ADD_TTFT = f"ALTER TABLE {TABLE} ADD COLUMN ttft_ms REAL"
# ... and one made before `batch_id`, that one (its old rows: "").
ADD_BATCH_ID = f"ALTER TABLE {TABLE} ADD COLUMN batch_id TEXT NOT NULL DEFAULT ''"
# ... and one made before the MCP calls' bytes, those (its old rows: 0).
ADD_BYTES = tuple(
    f"ALTER TABLE {TABLE} ADD COLUMN {name} INTEGER NOT NULL DEFAULT 0"
    for name in ("bytes_in", "bytes_out")
)
# ... and one made before the outcome, that (its old rows: "").
ADD_OUTCOME = f"ALTER TABLE {TABLE} ADD COLUMN outcome TEXT NOT NULL DEFAULT ''"
INSERT = (
    f"INSERT OR IGNORE INTO {TABLE} ({', '.join(COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in COLUMNS)})"
)
BUSY_TIMEOUT_MS = 5000
# The columns added since the first ledgers, and what an older row holds in each.
_ADDED = (
    ("ttft_ms", "NULL"),
    ("batch_id", "''"),
    ("bytes_in", "0"),
    ("bytes_out", "0"),
    ("outcome", "''"),
)


def connect_shared(
    path: Path,
    prepare: Callable[[sqlite3.Connection], object],
    busy_timeout_ms: int = BUSY_TIMEOUT_MS,
) -> sqlite3.Connection:
    """A connection to the SQLite file at `path` (made, with its directory, if absent)
    that several processes share: WAL, so that readers go on while one writes; writes
    wait for each other up to `busy_timeout_ms`; `prepare` (the schema) run on it first, the
    connection closed if that fails. Autocommit: callers begin their transactions."""
    path.parent.mkdir(parents=True, exist_ok=True)
    connection = sqlite3.connect(path, timeout=busy_timeout_ms / 1000, isolation_level=None)
    try:
        connection.execute("PRAGMA journal_mode=WAL")
        # WAL with NORMAL loses at most the last commits on a power cut, never the file;
        # a full sync per transaction would cost a disk flush each time.
        connection.execute("PRAGMA synchronous=NORMAL")
        prepare(connection)
    except BaseException:
        connection.close()
        raise
    return connection


def _make_schema(connection: sqlite3.Connection) -> None:
    columns = {row[1] for row in connection.execute(f"PRAGMA table_info({TABLE})")}
    if columns and "ttft_ms" not in columns:
        connection.execute(ADD_TTFT)
    if columns and "batch_id" not in columns:
        connection.execute(ADD_BATCH_ID)
    if columns and "bytes_in" not in columns:
        for statement in ADD_BYTES:
            connection.execute(statement)
    if columns and "outcome" not in columns:
        connection.execute(ADD_OUTCOME)
    connection.executescript(SCHEMA)


class SqliteLedger:
    """Usage records in the SQLite file at `path` (created with its table if absent).

    `read_only`: the file is opened to read (`mode=ro`), never created nor changed; each
    failure to read it is a `LedgerUnavailable` (`LedgerMissing` when it does not exist).
    """

    def __init__(self, path: str | Path, *, read_only: bool = False) -> None:
        self.path = Path(path)
        self.read_only = read_only
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledger-sqlite")
        self._connection: sqlite3.Connection | None = None

    async def _call(self, work: Callable[[sqlite3.Connection], T]) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, self._run, work)

    def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        # Runs on the store's thread only: the connection is made and used there.
        if self.read_only:
            return self._read(work)
        if self._connection is None:
            self._connection = connect_shared(self.path, _make_schema)
        return work(self._connection)

    def _read(self, work: Callable[[sqlite3.Connection], T]) -> T:
        try:
            if self._connection is None:
                self._connection = self._open_to_read()
            return work(self._connection)
        except sqlite3.Error as error:
            if self.path.is_dir():
                reason = "it is a directory"
            else:
                reason = " ".join(str(error).split()) or type(error).__name__
            raise LedgerUnavailable(f"cannot read the usage ledger {self.path}: {reason}") from None

    def _open_to_read(self) -> sqlite3.Connection:
        # `mode=ro`: SQLite neither creates the file nor writes it (nor its directory).
        if not self.path.exists():
            raise LedgerMissing(self.path)
        uri = f"{self.path.absolute().as_uri()}?mode=ro"
        try:
            connection = sqlite3.connect(
                uri, uri=True, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None
            )
        except sqlite3.OperationalError:
            if not self.path.exists():  # gone since it was looked at
                raise LedgerMissing(self.path) from None
            raise
        try:
            found = connection.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (TABLE,)
            ).fetchone()
        except BaseException:
            connection.close()
            raise
        if found is None:
            connection.close()
            raise LedgerUnavailable(f"{self.path} holds no usage ledger (no {TABLE} table)")
        # A file an older gateway wrote lacks the newer columns, and a reader may not add
        # them: a view of the same name, in the connection's own temporary schema (which
        # a read-only file allows), shows them with what their old rows mean.
        columns = {row[1] for row in connection.execute(f"PRAGMA table_info({TABLE})")}
        missing = [f"{default} AS {name}" for name, default in _ADDED if name not in columns]
        if missing:
            connection.execute(
                f"CREATE TEMP VIEW {TABLE} AS SELECT *, {', '.join(missing)} FROM main.{TABLE}"
            )
        return connection

    async def write(self, batch: Sequence[UsageRecord]) -> int:
        """Insert the batch in one transaction, skipping request ids already stored."""
        rows = [record.row() for record in batch]

        def insert(connection: sqlite3.Connection) -> int:
            before = connection.total_changes
            try:
                with connection:
                    connection.execute("BEGIN IMMEDIATE")
                    connection.executemany(INSERT, rows)
            except OverflowError:
                # A count past 64 bits: refused whatever the retries, so held within.
                before = connection.total_changes  # what was rolled back still counted
                with connection:
                    connection.execute("BEGIN IMMEDIATE")
                    connection.executemany(INSERT, [clean_row(row) for row in rows])
            return connection.total_changes - before

        return await self._call(insert)

    async def query(self, query: ReportQuery) -> list[ReportRow]:
        """The usage report's rows."""
        sql, args = sqlite_sql(query)
        rows = await self._call(lambda connection: connection.execute(sql, args).fetchall())
        return as_rows(query, rows)

    async def requests(self, query: RequestsQuery) -> list[UsageRecord]:
        """One key's records, oldest first."""
        sql, args = usage_requests.sqlite_sql(query)
        rows = await self._call(lambda connection: connection.execute(sql, args).fetchall())
        return [from_row(row) for row in rows]

    async def count(self) -> int:
        """How many records the file holds."""
        row = await self._call(
            lambda connection: connection.execute(f"SELECT count(*) FROM {TABLE}").fetchone()
        )
        return int(row[0])

    async def close(self) -> None:
        """Close the connection and stop the thread."""

        def close(_: sqlite3.Connection | None = None) -> None:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._thread, close)
        self._thread.shutdown(wait=True)
