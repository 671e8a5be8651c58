"""The usage ledger's cost to the gateway: CPU per request, and the batch insert methods.

    .venv/bin/python -m loadtest.ledger_cost [--records 100000] [--batch 500]
        [--store sqlite|postgres|both] [--inserts] [--postgres postgresql://postgres@127.0.0.1]

Per request, the gateway makes one `UsageRecord` and calls `LedgerWriter.record()` on
the request path; later the flusher writes it in a batch (its CPU counted here: the
encoding, the driver, SQLite's own thread; not the PostgreSQL server, another process).
The process's CPU time of each part is divided by the records: the budget is 20 µs a
request in all (issue 27).

`--inserts` times PostgreSQL's three ways of writing a batch that skips records already
stored (`unnest` arrays in one INSERT, `executemany`, COPY into a temporary table then
INSERT ... SELECT) for batches of 100, 300 and 1000: wall time and this process's CPU per
record. Each run uses a database of its own (`ledger_bench_<random>`), dropped after.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]

from gateway.ledger.ledger_store import LedgerStore
from gateway.ledger.ledger_writer import LedgerWriter
from gateway.ledger.postgres_ledger import InsertMethod, PostgresLedger
from gateway.ledger.sqlite_ledger import SqliteLedger
from gateway.ledger.usage_records import UsageRecord


class TcpOutage:
    """A TCP proxy to PostgreSQL that can fail: `cut()` closes its connections and stops
    listening (connections refused), `hang` accepts and never answers, `restore()` listens
    again on the same port. The database outage of the tests and `--outage`, no mock."""

    def __init__(self, target_port: int = 5432) -> None:
        self.target_port = target_port
        self.port = 0
        self.hang = False
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.StreamWriter] = set()

    async def restore(self) -> None:
        """Listen (again), on the port of the first time."""
        self._server = await asyncio.start_server(
            self._link, "127.0.0.1", self.port, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        """Stop listening and break every connection through the proxy."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for link in list(self._links):
            link.transport.abort()
        self._links.clear()

    async def _link(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._links.add(writer)
        upstream: asyncio.StreamWriter | None = None
        try:
            if self.hang:
                while await reader.read(65536):
                    pass
                return
            upstream_reader, upstream = await asyncio.open_connection("127.0.0.1", self.target_port)
            self._links.add(upstream)
            await asyncio.gather(
                _pipe(reader, upstream), _pipe(upstream_reader, writer), return_exceptions=True
            )
        except OSError:
            pass
        finally:
            for link in (writer, upstream):
                if link is not None:
                    link.transport.abort()
                    self._links.discard(link)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.transport.abort()


TENANTS = ("acme", "globex", "initech", "umbrella")
MODELS = ("llama-8b", "llama-70b", "qwen-coder")


def _record(i: int, prefix: str) -> UsageRecord:
    return UsageRecord(
        time.time(),
        f"{prefix}{i:012x}",
        TENANTS[i % 4],
        f"key{i % 16}",
        "chat",
        MODELS[i % 3],
        MODELS[i % 3],
        120 + i % 50,
        i % 64,
        40 + i % 200,
        1234 + i % 1000,
        52.5 + i % 300,
        200 if i % 50 else 503,
        "",
    )


@asynccontextmanager
async def _database(server: str) -> AsyncIterator[str]:
    name = f"ledger_bench_{os.urandom(4).hex()}"
    admin = await asyncpg.connect(f"{server}/postgres")
    try:
        await admin.execute(f"CREATE DATABASE {name}")
        try:
            yield f"{server}/{name}"
        finally:
            await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        await admin.close()


async def _cost(store: LedgerStore, records: int, batch: int, label: str) -> None:
    with tempfile.TemporaryDirectory() as spool:
        writer = LedgerWriter(store, spool, batch_max=batch, buffer_max=records + 1)
        # The store's table made and its connection opened first: not a request's cost.
        await store.write([_record(0, "warmup")])
        prefix = os.urandom(6).hex()
        record = writer.record
        made = time.process_time()
        built = [_record(i, prefix) for i in range(records)]
        made = time.process_time() - made
        taken = time.process_time()
        for item in built:
            record(item)
        taken = time.process_time() - taken
        flushed = time.process_time()
        await writer.flush()
        flushed = time.process_time() - flushed
        stats = writer.stats()
        await writer.close()
    assert stats.written == records and stats.dropped == 0, stats
    per = 1e6 / records
    print(
        f"{label:9} record() {taken * per:5.2f} µs   flush {flushed * per:5.2f} µs   "
        f"total {(taken + flushed) * per:5.2f} µs/request   "
        f"(making a UsageRecord in this loop: {made * per:5.2f} µs)"
    )


async def _inserts(server: str, batches: list[int], total: int) -> None:
    methods: list[InsertMethod] = ["unnest", "executemany", "copy"]
    print(f"PostgreSQL, {total} records per run; wall and client CPU per record")
    for batch in batches:
        for method in methods:
            async with _database(server) as dsn:
                store = PostgresLedger(dsn, insert_method=method)
                await store.write([_record(0, "warmup")])
                prefix = os.urandom(6).hex()
                built = [_record(i, prefix) for i in range(total)]
                cpu = time.process_time()
                wall = time.perf_counter()
                for start in range(0, total, batch):
                    await store.write(built[start : start + batch])
                wall = time.perf_counter() - wall
                cpu = time.process_time() - cpu
                # A replay of the same records: every one a duplicate, skipped.
                again = time.perf_counter()
                for start in range(0, total, batch):
                    await store.write(built[start : start + batch])
                again = time.perf_counter() - again
                count = await store.count()
                await store.close()
            assert count == total + 1, count
            print(
                f"batch {batch:5}  {method:12} wall {wall / total * 1e6:6.2f} µs  "
                f"cpu {cpu / total * 1e6:5.2f} µs  replayed (all duplicates) "
                f"{again / total * 1e6:6.2f} µs"
            )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--store", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--inserts", action="store_true")
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432")
    args = parser.parse_args()
    if args.inserts:
        await _inserts(args.postgres, [100, 300, 1000], args.records)
        return
    if args.store in ("sqlite", "both"):
        with tempfile.TemporaryDirectory() as directory:
            sqlite = SqliteLedger(Path(directory) / "usage.db")
            await _cost(sqlite, args.records, args.batch, "sqlite")
    if args.store in ("postgres", "both"):
        async with _database(args.postgres) as dsn:
            await _cost(PostgresLedger(dsn), args.records, args.batch, "postgres")


if __name__ == "__main__":
    asyncio.run(main())
