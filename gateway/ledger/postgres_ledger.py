"""The ledger in PostgreSQL: several gateways write to one database (asyncpg).

A batch is COPYed into a temporary staging table (one per connection), then moved by
`INSERT ... SELECT ... ON CONFLICT (request_id) DO NOTHING` in the same transaction: COPY
cannot skip a record already stored itself, and a replay after a partial failure holds
some. Measured by `loadtest/ledger_cost.py --inserts` against one `INSERT` of `unnest`ed
arrays and against `executemany`, for batches of 100 to 1000: COPY costs the gateway the
least CPU from 300 records a batch (about 1.2-1.9 µs a record, against 1.7-2.1 for
`executemany` and 3.6-4 for `unnest`), in about the same wall time; the other two remain
as `insert_method` for comparison. A temporary table needs a session of its own: behind a
pooler in transaction mode (PgBouncer), use `executemany`.

Opened to read only (a report), the store makes no table, and a database that does not
answer, or holds no ledger, is a `LedgerUnavailable` that says so in one line.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Literal
from urllib.parse import urlsplit

import asyncpg  # type: ignore[import-untyped]  # asyncpg ships no types

from gateway.ledger import usage_requests
from gateway.ledger.errors import LedgerUnavailable
from gateway.ledger.usage_records import COLUMNS, Row, UsageRecord, clean_row, from_row
from gateway.ledger.usage_report import TABLE, ReportQuery, ReportRow, as_rows, postgres_sql
from gateway.ledger.usage_requests import RequestsQuery

InsertMethod = Literal["unnest", "executemany", "copy"]

# The columns' SQL types, in `COLUMNS` order; `ts` arrives as unix seconds.
TYPES = (
    "double precision",
    "text",
    "text",
    "text",
    "text",
    "text",
    "text",
    "bigint",
    "bigint",
    "bigint",
    "bigint",
    "double precision",
    "bigint",
    "text",
    "double precision",
    "text",
    "bigint",
    "bigint",
    "text",
)
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    request_id text PRIMARY KEY,
    ts timestamptz NOT NULL,
    tenant text NOT NULL,
    key_id text NOT NULL,
    endpoint text NOT NULL,
    model_requested text NOT NULL,
    model_served text NOT NULL,
    prompt_tokens bigint NOT NULL,
    cached_tokens bigint NOT NULL,
    completion_tokens bigint NOT NULL,
    cost_micros bigint NOT NULL,
    latency_ms double precision NOT NULL,
    status bigint NOT NULL,
    fallback text NOT NULL,
    ttft_ms double precision,
    batch_id text NOT NULL DEFAULT '',
    bytes_in bigint NOT NULL DEFAULT 0,
    bytes_out bigint NOT NULL DEFAULT 0,
    outcome text NOT NULL DEFAULT ''
);
-- A table made before `ttft_ms` was recorded gets the column (its old rows: NULL).
ALTER TABLE {TABLE} ADD COLUMN IF NOT EXISTS ttft_ms double precision;
-- ... and before `batch_id` (the Batch APIs' lines), that one (its old rows: '').
ALTER TABLE {TABLE} ADD COLUMN IF NOT EXISTS batch_id text NOT NULL DEFAULT '';
-- ... and before the MCP calls' bytes, those (its old rows: 0).
ALTER TABLE {TABLE} ADD COLUMN IF NOT EXISTS bytes_in bigint NOT NULL DEFAULT 0;
ALTER TABLE {TABLE} ADD COLUMN IF NOT EXISTS bytes_out bigint NOT NULL DEFAULT 0;
-- ... and before the outcome, that (its old rows: '').
ALTER TABLE {TABLE} ADD COLUMN IF NOT EXISTS outcome text NOT NULL DEFAULT '';
CREATE INDEX IF NOT EXISTS {TABLE}_ts ON {TABLE} (ts);
CREATE INDEX IF NOT EXISTS {TABLE}_key_ts ON {TABLE} (key_id, ts);
"""
# Two gateways starting together would race on CREATE TABLE IF NOT EXISTS (a unique
# violation in the catalogue): the schema is made under a transaction-scoped lock.
SCHEMA_LOCK = 0x1ED6E7
_SELECTED = ", ".join("to_timestamp(ts)" if name == "ts" else name for name in COLUMNS)
INSERT_UNNEST = (
    f"INSERT INTO {TABLE} ({', '.join(COLUMNS)}) SELECT {_SELECTED} FROM unnest("
    + ", ".join(f"${i + 1}::{kind}[]" for i, kind in enumerate(TYPES))
    + f") AS batch ({', '.join(COLUMNS)}) ON CONFLICT (request_id) DO NOTHING"
)
INSERT_ROW = (
    f"INSERT INTO {TABLE} ({', '.join(COLUMNS)}) VALUES ("
    + ", ".join(
        f"to_timestamp(${i + 1})" if n == "ts" else f"${i + 1}" for i, n in enumerate(COLUMNS)
    )
    + ") ON CONFLICT (request_id) DO NOTHING"
)
STAGING = f"{TABLE}_staging"
CREATE_STAGING = (
    f"CREATE TEMPORARY TABLE IF NOT EXISTS {STAGING} ("
    + ", ".join(f"{name} {kind}" for name, kind in zip(COLUMNS, TYPES, strict=True))
    + ") ON COMMIT DELETE ROWS"
)
INSERT_STAGED = (
    f"INSERT INTO {TABLE} ({', '.join(COLUMNS)}) SELECT {_SELECTED} FROM {STAGING} "
    "ON CONFLICT (request_id) DO NOTHING"
)
CONNECT_TIMEOUT_S = 5.0
COMMAND_TIMEOUT_S = 30.0


class PostgresLedger:
    """Usage records in PostgreSQL at `dsn`; the table is created on first use.

    The pool opens no connection until one is needed, so the store can be made while the
    database is down; a batch then fails (and the writer spools it) until it is back.
    `read_only`: the store only reads (a report): it makes no table, and each failure to
    read is a `LedgerUnavailable`.
    """

    def __init__(
        self,
        dsn: str,
        *,
        insert_method: InsertMethod = "copy",
        max_connections: int = 2,
        read_only: bool = False,
    ) -> None:
        self.dsn = dsn
        self.read_only = read_only
        self.insert_method = insert_method
        self._max_connections = max_connections
        self._pool: asyncpg.Pool | None = None
        self._schema_ready = False
        self._opening = asyncio.Lock()

    async def _ready_pool(self) -> asyncpg.Pool:
        if self._pool is not None and (self._schema_ready or self.read_only):
            return self._pool
        async with self._opening:
            if self._pool is None:
                self._pool = await asyncpg.create_pool(
                    self.dsn,
                    min_size=0,
                    max_size=self._max_connections,
                    timeout=CONNECT_TIMEOUT_S,
                    command_timeout=COMMAND_TIMEOUT_S,
                    init=self._init_connection,
                )
            if not self._schema_ready and not self.read_only:
                async with self._pool.acquire() as connection, connection.transaction():
                    await connection.execute("SELECT pg_advisory_xact_lock($1)", SCHEMA_LOCK)
                    await connection.execute(SCHEMA)
                self._schema_ready = True
            return self._pool

    async def _init_connection(self, connection: Any) -> None:
        # COPY's staging table, made once per connection (a temporary table is the
        # session's own) rather than once per batch: one round trip less a batch.
        if self.insert_method == "copy" and not self.read_only:
            await connection.execute(CREATE_STAGING)

    async def write(self, batch: Sequence[UsageRecord]) -> int:
        """Insert the batch in one transaction, skipping request ids already stored.

        Returns how many were new (`executemany` cannot tell: it returns the batch's size).
        """
        if not batch:
            return 0
        pool = await self._ready_pool()
        rows = [record.row() for record in batch]
        try:
            try:
                return await self._insert(pool, rows)
            except (asyncpg.DataError, OverflowError):
                # A text with a NUL, a count past 64 bits: refused whatever the retries.
                return await self._insert(pool, [clean_row(row) for row in rows])
        except asyncpg.UndefinedTableError:
            # The table is gone (the database dropped and made again, say): made again
            # before the next batch, which the writer retries from its spool.
            self._schema_ready = False
            raise

    async def _insert(self, pool: Any, rows: list[Row]) -> int:
        async with pool.acquire() as connection:
            if self.insert_method == "unnest":
                status: str = await connection.execute(
                    INSERT_UNNEST, *map(list, zip(*rows, strict=True))
                )
                return int(status.rsplit(" ", 1)[1])
            if self.insert_method == "executemany":
                await connection.executemany(INSERT_ROW, rows)
                return len(rows)
            try:
                return await _copy(connection, rows)
            except asyncpg.UndefinedTableError:
                # The session lost its staging table (a pooler, DISCARD): made again.
                await connection.execute(CREATE_STAGING)
                return await _copy(connection, rows)

    async def query(self, query: ReportQuery) -> list[ReportRow]:
        """The usage report's rows."""
        sql, args = postgres_sql(query)
        rows = await self._fetch(sql, args)
        return as_rows(query, (tuple(row.values()) for row in rows))

    async def requests(self, query: RequestsQuery) -> list[UsageRecord]:
        """One key's records, oldest first."""
        sql, args = usage_requests.postgres_sql(query)
        rows = await self._fetch(sql, args)
        return [from_row(tuple(row.values())) for row in rows]

    async def _fetch(self, sql: str, args: Sequence[object]) -> list[Any]:
        try:
            pool = await self._ready_pool()
            return list(await pool.fetch(sql, *args))
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
            if not self.read_only:  # the gateway's own reads: its callers map these
                raise
            if isinstance(error, asyncpg.UndefinedTableError):
                reason = f"the database {_shown(self.dsn)} holds no usage ledger (no {TABLE} table)"
            else:
                detail = " ".join(str(error).split()) or type(error).__name__
                reason = f"cannot read the usage ledger in {_shown(self.dsn)}: {detail}"
            raise LedgerUnavailable(reason) from None

    async def count(self) -> int:
        """How many records the table holds."""
        pool = await self._ready_pool()
        value = await pool.fetchval(f"SELECT count(*) FROM {TABLE}")
        return int(value)

    async def close(self) -> None:
        """Close the pool's connections."""
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
        self._schema_ready = False


def _shown(dsn: str) -> str:
    """The DSN without its password, to be printed."""
    parts = urlsplit(dsn)
    user, _, hosts = parts.netloc.rpartition("@")
    user = user.partition(":")[0]
    return f"{parts.scheme}://{user + '@' if user else ''}{hosts}{parts.path}"


async def _copy(connection: Any, rows: list[Row]) -> int:
    async with connection.transaction():
        await connection.copy_records_to_table(STAGING, records=rows, columns=COLUMNS)
        status: str = await connection.execute(INSERT_STAGED)
    return int(status.rsplit(" ", 1)[1])
