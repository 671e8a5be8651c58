"""The database batch records live in: SQLite (embedded) or PostgreSQL, one small interface.

The batch store (`batch_store.py`) writes its statements once, with `?` placeholders
and portable types; each database here runs them in transactions:

- **SQLite**: one connection on a thread of its own (a connection belongs to one
  thread); a transaction is `BEGIN IMMEDIATE` (the write lock at once, so claims never
  race) and holds an asyncio lock, so that no other transaction's statements interleave
  on the connection. WAL lets several gateway processes on one machine share the file.
- **PostgreSQL** (asyncpg): a pool; `?` becomes `$n`; `{skip_locked}` becomes
  `FOR UPDATE SKIP LOCKED`, so that gateways claiming lines at once take different ones;
  `lock(name)` is a transaction-scoped advisory lock (SQLite's write lock already is one).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar

from gateway.config.ledger_config import POSTGRES_SCHEMES, SQLITE_SCHEME
from gateway.ledger.sqlite_ledger import connect_shared

T = TypeVar("T")
Row = tuple[Any, ...]
# Claims and commits of several gateway processes on one file take turns this long.
BUSY_TIMEOUT_MS = 10_000


class Transaction(Protocol):
    """Statements run in one transaction."""

    async def fetch(self, sql: str, *args: Any) -> list[Row]:
        """The rows `sql` selects (or returns)."""
        ...

    async def execute(self, sql: str, *args: Any) -> int:
        """Run `sql`; how many rows it changed."""
        ...

    async def execute_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Run `sql` once per row of arguments."""
        ...

    async def lock(self, name: str) -> None:
        """Hold `name` until the transaction ends (another transaction locking it waits)."""
        ...


class BatchDatabase(Protocol):
    """Where batch records are: transactions on it, and its schema made once."""

    def transaction(self) -> AbstractAsyncContextManager[Transaction]:
        """`async with database.transaction() as tx:` committed at the block's end,
        rolled back if it raises."""
        ...

    async def close(self) -> None:
        """Release connections and threads."""
        ...


def open_database(url: str, schema: str) -> BatchDatabase:
    """The database at `url` (the ledger's URL forms), `schema` made on first use."""
    if url.startswith(POSTGRES_SCHEMES):
        return PostgresDatabase(url, schema)
    if url.startswith(SQLITE_SCHEME):
        return SqliteDatabase(Path(url[len(SQLITE_SCHEME) :]), schema)
    raise ValueError("a database URL is postgresql://... or sqlite:///path")


class SqliteDatabase:
    """An SQLite file, its one connection on a thread of its own."""

    def __init__(self, path: Path, schema: str) -> None:
        self.path = path
        self._schema = schema
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batches-sqlite")
        self._connection: sqlite3.Connection | None = None
        self._lock = asyncio.Lock()

    async def _call(self, work: Callable[[sqlite3.Connection], T]) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, self._run, work)

    def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        if self._connection is None:
            schema = _portable(self._schema, postgres=False)
            self._connection = connect_shared(
                self.path, lambda c: c.executescript(schema), BUSY_TIMEOUT_MS
            )
        return work(self._connection)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Transaction]:
        async with self._lock:
            await self._call(lambda c: c.execute("BEGIN IMMEDIATE"))
            try:
                yield _SqliteTransaction(self)
            except BaseException:
                await asyncio.shield(self._call(lambda c: c.execute("ROLLBACK")))
                raise
            await asyncio.shield(self._call(lambda c: c.execute("COMMIT")))

    async def close(self) -> None:
        def close(_: sqlite3.Connection | None = None) -> None:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._thread, close)
        self._thread.shutdown(wait=True)


class _SqliteTransaction:
    def __init__(self, database: SqliteDatabase) -> None:
        self._database = database

    async def fetch(self, sql: str, *args: Any) -> list[Row]:
        statement = _portable(sql, postgres=False)
        return await self._database._call(lambda c: c.execute(statement, args).fetchall())

    async def execute(self, sql: str, *args: Any) -> int:
        statement = _portable(sql, postgres=False)
        return await self._database._call(lambda c: c.execute(statement, args).rowcount)

    async def execute_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        statement = _portable(sql, postgres=False)
        await self._database._call(lambda c: c.executemany(statement, rows))

    async def lock(self, name: str) -> None:
        return None  # BEGIN IMMEDIATE took the database's one write lock


class PostgresDatabase:
    """PostgreSQL through an asyncpg pool, the schema made under an advisory lock."""

    def __init__(self, url: str, schema: str) -> None:
        self._url = url
        self._schema = schema
        self._pool: Any = None
        self._opening = asyncio.Lock()

    async def _ready_pool(self) -> Any:
        if self._pool is not None:
            return self._pool
        async with self._opening:
            if self._pool is None:
                import asyncpg  # type: ignore[import-untyped]  # asyncpg ships no types

                pool = await asyncpg.create_pool(self._url, min_size=1, max_size=4, timeout=10)
                async with pool.acquire() as connection, connection.transaction():
                    await connection.execute("SELECT pg_advisory_xact_lock($1)", _SCHEMA_LOCK)
                    await connection.execute(_portable(self._schema, postgres=True))
                self._pool = pool
        return self._pool

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Transaction]:
        pool = await self._ready_pool()
        async with pool.acquire() as connection, connection.transaction():
            yield _PostgresTransaction(connection)

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None


class _PostgresTransaction:
    def __init__(self, connection: Any) -> None:
        self._connection = connection

    async def fetch(self, sql: str, *args: Any) -> list[Row]:
        rows = await self._connection.fetch(_portable(sql, postgres=True), *args)
        return [tuple(row) for row in rows]

    async def execute(self, sql: str, *args: Any) -> int:
        status: str = await self._connection.execute(_portable(sql, postgres=True), *args)
        # "UPDATE 3", "INSERT 0 1", "DELETE 0": the count is the last word.
        last = status.rsplit(" ", 1)[-1]
        return int(last) if last.isdecimal() else 0

    async def execute_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        await self._connection.executemany(_portable(sql, postgres=True), rows)

    async def lock(self, name: str) -> None:
        key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)
        await self._connection.execute("SELECT pg_advisory_xact_lock($1)", key)


# Two gateways starting together would race on CREATE TABLE IF NOT EXISTS.
_SCHEMA_LOCK = 0x1ED6E8
_PLACEHOLDER = re.compile(r"\?")
_portable_cache: dict[tuple[str, bool], str] = {}


def _portable(sql: str, *, postgres: bool) -> str:
    """`sql` for one database: `?` placeholders numbered for PostgreSQL, `{skip_locked}`
    and the types `{bytes}`, `{float}` in each one's own words."""
    cached = _portable_cache.get((sql, postgres))
    if cached is not None:
        return cached
    text = sql.replace("{skip_locked}", "FOR UPDATE SKIP LOCKED" if postgres else "")
    text = text.replace("{float}", "DOUBLE PRECISION" if postgres else "REAL")
    text = text.replace("{int}", "BIGINT" if postgres else "INTEGER")
    if postgres:
        numbers = iter(range(1, 10_000))
        text = _PLACEHOLDER.sub(lambda _: f"${next(numbers)}", text)
    if len(_portable_cache) < 512:
        _portable_cache[(sql, postgres)] = text
    return text
