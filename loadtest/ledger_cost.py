"""The usage ledger's cost to the gateway: CPU per request, and the batch insert methods.

    .venv/bin/python -m loadtest.ledger_cost [--records 100000] [--batch 500]
        [--store sqlite|postgres|both] [--inserts] [--postgres postgresql://postgres@127.0.0.1]
        [--outage SECONDS [--rate 2000]] [--steady SECONDS [--rate 2000]]

Per request, the gateway makes one `UsageRecord` and calls `LedgerWriter.record()` on
the request path; later the flusher writes it in a batch (its CPU counted here: the
encoding, the driver, SQLite's own thread; not the PostgreSQL server, another process).
The process's CPU time of each part is divided by the records: the budget is 20 µs a
request in all (issue 27).

`--inserts` times PostgreSQL's three ways of writing a batch that skips records already
stored (`unnest` arrays in one INSERT, `executemany`, COPY into a temporary table then
INSERT ... SELECT) for batches of 100, 300 and 1000: wall time and this process's CPU per
record. Each run uses a database of its own (`ledger_bench_<random>`), dropped after.

`--steady S` measures the same in steady state: `--rate` requests a second for S
seconds, each making its record and handing it to a writer on PostgreSQL, against the
same loop making none; the difference in the process's CPU, divided by the requests, is
the ledger's whole cost (the flusher's wake-ups, batches and driver included). Rounds
alternate, three of each; the median is printed.

`--outage S` runs `--rate` requests a second, each making its record, through a writer
whose PostgreSQL is behind a proxy that is cut for S seconds (connections broken and
refused), then restored: the event loop's lag (what would delay a request) and record()'s
own time before, during and after, the spool's peak, the time to replay it, and the
rows in the database against the records made.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
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


async def _steady_round(writer: LedgerWriter | None, seconds: float, rate: int) -> float:
    """The process's CPU seconds per request over one round at `rate` requests a second."""
    per_tick = max(1, rate // 1000)
    prefix = os.urandom(6).hex()
    made = 0
    cpu = time.process_time()
    due = time.perf_counter()
    end = due + seconds
    while due < end:
        due += 0.001
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        for _ in range(per_tick):
            if writer is not None:
                writer.record(_record(made, prefix))
            made += 1
    if writer is not None:
        await writer.flush()
    return (time.process_time() - cpu) / made


async def _steady(server: str, seconds: float, rate: int, batch: int) -> None:
    async with _database(server) as dsn:
        with tempfile.TemporaryDirectory() as spool:
            writer = LedgerWriter(PostgresLedger(dsn), spool, batch_max=batch)
            await writer.start()
            await writer.store.write([_record(0, "warmup")])
            with_ledger, without = [], []
            for _ in range(3):
                with_ledger.append(await _steady_round(writer, seconds, rate))
                without.append(await _steady_round(None, seconds, rate))
            stats = writer.stats()
            await writer.close()
    cost = statistics.median(with_ledger) - statistics.median(without)
    print(
        f"{rate} requests/s for {seconds:.0f} s x3: {statistics.median(without) * 1e6:.2f} "
        f"µs a request without the ledger, {statistics.median(with_ledger) * 1e6:.2f} with: "
        f"the ledger costs {cost * 1e6:.2f} µs a request ({stats.written} written)"
    )


def _quantiles(values: list[float]) -> str:
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3

    return f"p50 {at(0.5):7.3f}  p99 {at(0.99):7.3f}  max {ordered[-1] * 1e3:7.3f} ms"


async def _outage(server: str, seconds: float, rate: int, batch: int) -> None:
    proxy = TcpOutage(int(server.rsplit(":", 1)[1]))
    await proxy.restore()
    async with _database(server) as dsn:
        name = dsn.rsplit("/", 1)[1]
        store = PostgresLedger(f"postgresql://postgres@127.0.0.1:{proxy.port}/{name}")
        with tempfile.TemporaryDirectory() as spool:
            writer = LedgerWriter(store, spool, batch_max=batch)
            await writer.start()
            phase = "before"
            lags: dict[str, list[float]] = {"before": [], "outage": [], "after": []}
            calls: dict[str, list[float]] = {"before": [], "outage": [], "after": []}
            made = 0
            peak = 0
            running = True
            prefix = os.urandom(6).hex()

            async def requests() -> None:
                # Requests arrive every millisecond, rate/1000 at a time; the lag of each
                # wake-up is what the ledger (or anything else) added to the loop.
                nonlocal made, peak
                per_tick = max(1, rate // 1000)
                tick = 0.001
                due = time.perf_counter()
                while running:
                    due += tick
                    await asyncio.sleep(max(0.0, due - time.perf_counter()))
                    woke = time.perf_counter()
                    lags[phase].append(max(0.0, woke - due))
                    for _ in range(per_tick):
                        record = _record(made, prefix)
                        started = time.perf_counter()
                        writer.record(record)
                        calls[phase].append(time.perf_counter() - started)
                        made += 1
                    if woke - due > 0.1:  # fell far behind (a pause): start again from now
                        due = woke
                    peak = max(peak, writer.stats().spool_bytes)

            load = asyncio.create_task(requests())
            await asyncio.sleep(10)
            phase = "outage"
            await proxy.cut()
            await asyncio.sleep(seconds)
            phase = "after"
            await proxy.restore()
            restored = time.perf_counter()
            while writer.stats().spooled:  # noqa: ASYNC110 - the writer has no event for it
                await asyncio.sleep(0.1)
            drained = time.perf_counter() - restored
            await asyncio.sleep(5)
            running = False
            await load
            await writer.close()
            stats = writer.stats()
        connection = await asyncpg.connect(dsn)
        rows = await connection.fetchval("SELECT count(*) FROM usage_ledger")
        await connection.close()
    await proxy.cut()
    print(f"{rate} requests/s, PostgreSQL cut for {seconds:.0f} s")
    for name in lags:
        print(f"  {name:6}  loop lag {_quantiles(lags[name])}   record() {_quantiles(calls[name])}")
    print(
        f"  made {made}, in the database {rows}, dropped {stats.dropped}; spool peak "
        f"{peak / 1e6:.1f} MB, replayed {drained:.1f} s after the database came back"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--store", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--inserts", action="store_true")
    parser.add_argument("--outage", type=float, default=0.0)
    parser.add_argument("--rate", type=int, default=2000)
    parser.add_argument("--steady", type=float, default=0.0)
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432")
    args = parser.parse_args()
    if args.steady:
        await _steady(args.postgres, args.steady, args.rate, args.batch)
        return
    if args.outage:
        await _outage(args.postgres, args.outage, args.rate, args.batch)
        return
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
