"""Files, batches and their lines in the database: the source of truth every gateway shares.

Each line of a batch is a row. A worker claims one with a lease: `lease_owner` (a token
of that claim alone) and `lease_until`. It records the answer with an update that holds
only while the lease is still its own (`commit`), so a line is answered once in the
output whatever runs it twice. A gateway that dies loses nothing: `reap` puts its
lines whose leases ran out back to `pending`, and another claims them. A batch is
finalized by the one worker that moves it to `finalizing` (`begin_finalize`); one stuck
there past `FINALIZE_LEASE_S` (its finalizer died) is taken over.

A tenant's batch concurrency is exact across gateways: a claim counts the tenant's live
leases under a lock of the tenant's (an advisory lock in PostgreSQL; SQLite's write lock).
Times are unix seconds of the gateways' clocks (kept by NTP: a lease is tens of seconds).
See docs/design/batches.md.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from gateway.batches.batch_database import BatchDatabase, Row, open_database
from gateway.batches.batch_records import (
    BatchApi,
    BatchRecord,
    BatchStatus,
    ClaimedLine,
    FileRecord,
    LineCounts,
    LineResult,
    LineState,
    LineUsage,
    NewLine,
    TokenCounts,
)

# How long a finalizer may take before another gateway takes the batch's files over.
FINALIZE_LEASE_S = 300.0
# Lines read at a time while the output is written.
_PAGE = 1000

SCHEMA = """
CREATE TABLE IF NOT EXISTS batch_files (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    owner TEXT NOT NULL,
    purpose TEXT NOT NULL,
    filename TEXT NOT NULL,
    bytes {int} NOT NULL,
    created_at {float} NOT NULL,
    expires_at {float},
    object_key TEXT NOT NULL,
    deleted_at {float}
);
CREATE INDEX IF NOT EXISTS batch_files_tenant ON batch_files (tenant, created_at);
CREATE INDEX IF NOT EXISTS batch_files_expiry ON batch_files (deleted_at, expires_at);
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY,
    api TEXT NOT NULL,
    tenant TEXT NOT NULL,
    key_id TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    input_file_id TEXT NOT NULL,
    completion_window TEXT NOT NULL,
    status TEXT NOT NULL,
    final_status TEXT NOT NULL,
    created_at {float} NOT NULL,
    expires_at {float} NOT NULL,
    total {int} NOT NULL,
    done {int} NOT NULL DEFAULT 0,
    failed {int} NOT NULL DEFAULT 0,
    cancelled {int} NOT NULL DEFAULT 0,
    expired {int} NOT NULL DEFAULT 0,
    input_tokens {int} NOT NULL DEFAULT 0,
    cached_tokens {int} NOT NULL DEFAULT 0,
    output_tokens {int} NOT NULL DEFAULT 0,
    models TEXT NOT NULL,
    metadata TEXT,
    errors TEXT,
    output_file_id TEXT,
    error_file_id TEXT,
    in_progress_at {float},
    finalizing_at {float},
    completed_at {float},
    failed_at {float},
    expired_at {float},
    cancelling_at {float},
    cancelled_at {float},
    finalizer TEXT,
    stopped_by TEXT,
    output_ttl_s {float} NOT NULL,
    deleted_at {float}
);
CREATE INDEX IF NOT EXISTS batches_tenant ON batches (tenant, api, created_at);
CREATE INDEX IF NOT EXISTS batches_status ON batches (status);
CREATE TABLE IF NOT EXISTS batch_lines (
    batch_id TEXT NOT NULL,
    line_no {int} NOT NULL,
    custom_id TEXT NOT NULL,
    tenant TEXT NOT NULL,
    model TEXT NOT NULL,
    body TEXT NOT NULL,
    state TEXT NOT NULL,
    lease_owner TEXT,
    lease_until {float},
    not_before {float},
    attempts {int} NOT NULL DEFAULT 0,
    status_code {int},
    request_id TEXT,
    result TEXT,
    PRIMARY KEY (batch_id, line_no)
);
CREATE INDEX IF NOT EXISTS batch_lines_open ON batch_lines (batch_id, model, state, line_no);
CREATE INDEX IF NOT EXISTS batch_lines_leases ON batch_lines (state, lease_until);
CREATE INDEX IF NOT EXISTS batch_lines_tenant ON batch_lines (tenant, state);
"""

_FILE_COLUMNS = "id, tenant, owner, purpose, filename, bytes, created_at, expires_at, object_key"
_BATCH_COLUMNS = (
    "id, api, tenant, key_id, endpoint, input_file_id, completion_window, status, "
    "final_status, created_at, expires_at, total, done, failed, cancelled, expired, "
    "input_tokens, cached_tokens, output_tokens, models, metadata, errors, output_file_id, "
    "error_file_id, in_progress_at, finalizing_at, completed_at, failed_at, expired_at, "
    "cancelling_at, cancelled_at, stopped_by, output_ttl_s"
)
_FILE_OF_TENANT = (
    f"SELECT {_FILE_COLUMNS} FROM batch_files WHERE id = ? AND tenant = ? "
    "AND deleted_at IS NULL AND (expires_at IS NULL OR expires_at > ?)"
)
# The statuses whose lines may still run, or wait to be finalized.
_OPEN = (BatchStatus.IN_PROGRESS.value, BatchStatus.CANCELLING.value)


class NotCancellable(Exception):
    """The batch has ended (or is ending): there is nothing left to cancel."""

    def __init__(self, status: BatchStatus) -> None:
        super().__init__(status.value)
        self.status = status


class NotDeletable(Exception):
    """The batch is still running: cancel it first."""


class BatchStore:
    """Files, batches and lines in one database (`url`: the ledger's forms)."""

    def __init__(self, url: str) -> None:
        self._db: BatchDatabase = open_database(url, SCHEMA)

    async def close(self) -> None:
        """Release the database's connections."""
        await self._db.close()

    # Files.

    async def add_file(self, file: FileRecord) -> None:
        """Record a file whose bytes are in the object store."""
        async with self._db.transaction() as tx:
            await tx.execute(
                f"INSERT INTO batch_files ({_FILE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                *_file_row(file),
            )

    async def file(self, tenant: str, file_id: str) -> FileRecord | None:
        """`tenant`'s file `file_id` (None: none of its, deleted, or expired)."""
        async with self._db.transaction() as tx:
            rows = await tx.fetch(_FILE_OF_TENANT, file_id, tenant, time.time())
        return _file(rows[0]) if rows else None

    async def file_bytes(self, tenant: str) -> int:
        """What `tenant`'s files hold (uploads and outputs, not deleted nor expired)."""
        async with self._db.transaction() as tx:
            rows = await tx.fetch(
                "SELECT coalesce(sum(bytes), 0) FROM batch_files WHERE tenant = ? "
                "AND deleted_at IS NULL AND (expires_at IS NULL OR expires_at > ?)",
                tenant,
                time.time(),
            )
        return int(rows[0][0])

    async def expired_files(self, now: float, limit: int = 100) -> list[FileRecord]:
        """Files past their expiry, not yet deleted: for the sweeper."""
        async with self._db.transaction() as tx:
            rows = await tx.fetch(
                f"SELECT {_FILE_COLUMNS} FROM batch_files WHERE deleted_at IS NULL "
                "AND expires_at <= ? LIMIT ?",
                now,
                limit,
            )
        return [_file(row) for row in rows]

    async def files(
        self,
        tenant: str,
        *,
        purpose: str | None,
        after: str | None,
        limit: int,
        newest_first: bool,
        hidden: str | None = None,
    ) -> tuple[list[FileRecord], bool]:
        """A page of `tenant`'s files (but those of purpose `hidden`), and whether more
        follow. `after`: a file id of the previous page (its last); ordered by creation,
        then id."""
        direction = "DESC" if newest_first else "ASC"
        past = "<" if newest_first else ">"
        where = ["tenant = ?", "deleted_at IS NULL", "(expires_at IS NULL OR expires_at > ?)"]
        args: list[Any] = [tenant, time.time()]
        if hidden is not None:
            where.append("purpose <> ?")
            args.append(hidden)
        if purpose is not None:
            where.append("purpose = ?")
            args.append(purpose)
        async with self._db.transaction() as tx:
            if after is not None:
                cursor = await tx.fetch(
                    "SELECT created_at FROM batch_files WHERE id = ? AND tenant = ?",
                    after,
                    tenant,
                )
                if not cursor:
                    return [], False
                where.append(f"(created_at {past} ? OR (created_at = ? AND id {past} ?))")
                args += [cursor[0][0], cursor[0][0], after]
            rows = await tx.fetch(
                f"SELECT {_FILE_COLUMNS} FROM batch_files WHERE {' AND '.join(where)} "
                f"ORDER BY created_at {direction}, id {direction} LIMIT ?",
                *args,
                limit + 1,
            )
        return [_file(row) for row in rows[:limit]], len(rows) > limit

    async def delete_file(self, tenant: str, file_id: str, now: float) -> FileRecord | None:
        """Mark `tenant`'s file deleted; the record it was (None: no such file)."""
        async with self._db.transaction() as tx:
            rows = await tx.fetch(
                f"SELECT {_FILE_COLUMNS} FROM batch_files "
                "WHERE id = ? AND tenant = ? AND deleted_at IS NULL",
                file_id,
                tenant,
            )
            if not rows:
                return None
            await tx.execute("UPDATE batch_files SET deleted_at = ? WHERE id = ?", now, file_id)
        return _file(rows[0])

    # Batches.

    async def create_batch(self, batch: BatchRecord, lines: Sequence[NewLine]) -> None:
        """Record a batch in progress and its lines: those to run `pending`, those that
        cannot run already `failed` (counted so)."""
        failed = sum(1 for line in lines if line.failed is not None)
        async with self._db.transaction() as tx:
            await tx.execute(
                f"INSERT INTO batches ({_BATCH_COLUMNS}) VALUES "
                f"({', '.join('?' for _ in _BATCH_COLUMNS.split(','))})",
                *_batch_row(batch, failed),
            )
            await tx.execute_many(
                "INSERT INTO batch_lines (batch_id, line_no, custom_id, tenant, model, body, "
                "state, status_code, result) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [_line_row(batch, line) for line in lines],
            )

    async def batch(self, tenant: str | None, batch_id: str, api: BatchApi) -> BatchRecord | None:
        """Batch `batch_id` of `api`, `tenant`'s (None: any tenant's, for operators)."""
        where, args = "id = ? AND api = ? AND deleted_at IS NULL", [batch_id, api.value]
        if tenant is not None:
            where += " AND tenant = ?"
            args.append(tenant)
        async with self._db.transaction() as tx:
            rows = await tx.fetch(f"SELECT {_BATCH_COLUMNS} FROM batches WHERE {where}", *args)
        return _batch(rows[0]) if rows else None

    async def find(self, batch_id: str) -> BatchRecord | None:
        """Batch `batch_id`, whoever's and of whichever API (for operators)."""
        async with self._db.transaction() as tx:
            rows = await tx.fetch(
                f"SELECT {_BATCH_COLUMNS} FROM batches WHERE id = ? AND deleted_at IS NULL",
                batch_id,
            )
        return _batch(rows[0]) if rows else None

    async def batches(
        self,
        tenant: str | None,
        api: BatchApi | None,
        *,
        after: str | None = None,
        before: str | None = None,
        limit: int = 20,
    ) -> tuple[list[BatchRecord], bool]:
        """A page of batches, newest first, and whether more follow: those older than
        `after` (an id), or the newest ones younger than `before`."""
        where: list[str] = ["deleted_at IS NULL"]
        args: list[Any] = []
        if tenant is not None:
            where.append("tenant = ?")
            args.append(tenant)
        if api is not None:
            where.append("api = ?")
            args.append(api.value)
        cursor_id = after if after is not None else before
        newest_first = before is None
        async with self._db.transaction() as tx:
            if cursor_id is not None:
                cursor = await tx.fetch(
                    "SELECT created_at FROM batches WHERE id = ?" + _AND_TENANT[tenant is None],
                    cursor_id,
                    *([] if tenant is None else [tenant]),
                )
                if not cursor:
                    return [], False
                past = "<" if newest_first else ">"
                where.append(f"(created_at {past} ? OR (created_at = ? AND id {past} ?))")
                args += [cursor[0][0], cursor[0][0], cursor_id]
            direction = "DESC" if newest_first else "ASC"
            rows = await tx.fetch(
                f"SELECT {_BATCH_COLUMNS} FROM batches WHERE {' AND '.join(where)} "
                f"ORDER BY created_at {direction}, id {direction} LIMIT ?",
                *args,
                limit + 1,
            )
        page = [_batch(row) for row in rows[:limit]]
        if not newest_first:
            page.reverse()  # the page's batches, newest first as every page is
        return page, len(rows) > limit

    async def cancel(self, tenant: str | None, batch_id: str, api: BatchApi, now: float) -> int:
        """Cancel a batch: its lines not yet run are cancelled now (how many), those
        running finish, then it is finalized `cancelled`. `NotCancellable` once it has
        ended; nothing when there is no such batch (the caller tells 404)."""
        async with self._db.transaction() as tx:
            rows = await tx.fetch(
                "SELECT status FROM batches WHERE id = ? AND api = ? AND deleted_at IS NULL"
                + _AND_TENANT[tenant is None],
                batch_id,
                api.value,
                *([] if tenant is None else [tenant]),
            )
            if not rows:
                return 0
            status = BatchStatus(rows[0][0])
            if status in (BatchStatus.CANCELLING, BatchStatus.CANCELLED):
                return 0  # asked twice: the same answer
            if status is not BatchStatus.IN_PROGRESS:
                raise NotCancellable(status)
            cancelled = await tx.execute(
                "UPDATE batch_lines SET state = ?, result = ? WHERE batch_id = ? AND state = ?",
                LineState.CANCELLED.value,
                _CANCELLED,
                batch_id,
                LineState.PENDING.value,
            )
            await tx.execute(
                "UPDATE batches SET status = ?, final_status = ?, cancelling_at = ?, "
                "cancelled = cancelled + ? WHERE id = ?",
                BatchStatus.CANCELLING.value,
                BatchStatus.CANCELLED.value,
                now,
                cancelled,
                batch_id,
            )
        return cancelled

    async def delete_batch(self, tenant: str, batch_id: str, api: BatchApi, now: float) -> bool:
        """Delete an ended batch (False: no such batch); `NotDeletable` while it runs."""
        async with self._db.transaction() as tx:
            rows = await tx.fetch(
                "SELECT status FROM batches WHERE id = ? AND api = ? AND tenant = ? "
                "AND deleted_at IS NULL",
                batch_id,
                api.value,
                tenant,
            )
            if not rows:
                return False
            if not BatchStatus(rows[0][0]).ended:
                raise NotDeletable
            await tx.execute("UPDATE batches SET deleted_at = ? WHERE id = ?", now, batch_id)
            await tx.execute("DELETE FROM batch_lines WHERE batch_id = ?", batch_id)
        return True

    async def open_batches(self, tenant: str) -> int:
        """How many of `tenant`'s batches have not ended."""
        async with self._db.transaction() as tx:
            rows = await tx.fetch(
                "SELECT count(*) FROM batches WHERE tenant = ? AND status IN (?, ?, ?)",
                tenant,
                *_OPEN,
                BatchStatus.FINALIZING.value,
            )
        return int(rows[0][0])

    async def count_by_status(self) -> dict[str, int]:
        """Every batch not deleted, by status."""
        async with self._db.transaction() as tx:
            rows = await tx.fetch(
                "SELECT status, count(*) FROM batches WHERE deleted_at IS NULL GROUP BY status"
            )
        return {status: int(count) for status, count in rows}

    # The workers' side.

    async def running(self) -> list[BatchRecord]:
        """The batches whose lines may run (in progress), oldest first."""
        async with self._db.transaction() as tx:
            rows = await tx.fetch(
                f"SELECT {_BATCH_COLUMNS} FROM batches WHERE status = ? ORDER BY created_at",
                BatchStatus.IN_PROGRESS.value,
            )
        return [_batch(row) for row in rows]

    async def reap(self, now: float) -> int:
        """Put lines whose leases ran out (their gateway died or stalled) back to
        `pending`; how many."""
        async with self._db.transaction() as tx:
            return await tx.execute(
                "UPDATE batch_lines SET state = ?, lease_owner = NULL, lease_until = NULL "
                "WHERE state = ? AND lease_until < ?",
                LineState.PENDING.value,
                LineState.LEASED.value,
                now,
            )

    async def claim(
        self,
        batch: BatchRecord,
        model: str,
        lease: str,
        now: float,
        lease_s: float,
        tenant_limit: int | None,
    ) -> ClaimedLine | None:
        """The next line of `batch` for `model`, leased to `lease` until `now + lease_s`;
        None when it has none ready, or its tenant holds `tenant_limit` leases already."""
        async with self._db.transaction() as tx:
            if tenant_limit is not None:
                await tx.lock(f"batches/{batch.tenant}")
                held = await tx.fetch(
                    "SELECT count(*) FROM batch_lines WHERE tenant = ? AND state = ?",
                    batch.tenant,
                    LineState.LEASED.value,
                )
                if int(held[0][0]) >= tenant_limit:
                    return None
            rows = await tx.fetch(
                "SELECT line_no, custom_id, body, attempts FROM batch_lines "
                "WHERE batch_id = ? AND model = ? AND state = ? "
                "AND (not_before IS NULL OR not_before <= ?) "
                "ORDER BY line_no LIMIT 1 {skip_locked}",
                batch.id,
                model,
                LineState.PENDING.value,
                now,
            )
            if not rows:
                return None
            line_no, custom_id, body, attempts = rows[0]
            await tx.execute(
                "UPDATE batch_lines SET state = ?, lease_owner = ?, lease_until = ?, "
                "attempts = attempts + 1 WHERE batch_id = ? AND line_no = ?",
                LineState.LEASED.value,
                lease,
                now + lease_s,
                batch.id,
                line_no,
            )
        return ClaimedLine(batch.id, int(line_no), custom_id, model, body, int(attempts) + 1, lease)

    async def extend(self, leases: Sequence[str], until: float) -> None:
        """Keep the lines of `leases` (still running here) leased until `until`."""
        if not leases:
            return
        async with self._db.transaction() as tx:
            await tx.execute_many(
                "UPDATE batch_lines SET lease_until = ? WHERE lease_owner = ? AND state = ?",
                [(until, lease, LineState.LEASED.value) for lease in leases],
            )

    async def commit(
        self,
        line: ClaimedLine,
        state: LineState,
        status_code: int,
        request_id: str,
        result: str,
        usage: LineUsage,
    ) -> bool:
        """Record a line's answer, if its lease is still `line.lease`; False: it is not
        (taken over after the lease ran out), and the answer is dropped."""
        counter = "done" if state is LineState.DONE else "failed"
        async with self._db.transaction() as tx:
            changed = await tx.execute(
                "UPDATE batch_lines SET state = ?, status_code = ?, request_id = ?, "
                "result = ?, lease_owner = NULL, lease_until = NULL, body = '' "
                "WHERE batch_id = ? AND line_no = ? AND state = ? AND lease_owner = ?",
                state.value,
                status_code,
                request_id,
                result,
                line.batch_id,
                line.line_no,
                LineState.LEASED.value,
                line.lease,
            )
            if changed:
                await tx.execute(
                    f"UPDATE batches SET {counter} = {counter} + 1, "
                    "input_tokens = input_tokens + ?, cached_tokens = cached_tokens + ?, "
                    "output_tokens = output_tokens + ? WHERE id = ?",
                    usage.input_tokens,
                    usage.cached_tokens,
                    usage.output_tokens,
                    line.batch_id,
                )
        return changed == 1

    async def release(self, line: ClaimedLine, not_before: float) -> None:
        """Give a line back, to run again from `not_before` (a limit said wait). A line
        given back was not lost with its gateway: its claim does not count as an attempt."""
        async with self._db.transaction() as tx:
            await tx.execute(
                "UPDATE batch_lines SET state = ?, lease_owner = NULL, lease_until = NULL, "
                "not_before = ?, attempts = attempts - 1 "
                "WHERE batch_id = ? AND line_no = ? AND lease_owner = ?",
                LineState.PENDING.value,
                not_before,
                line.batch_id,
                line.line_no,
                line.lease,
            )

    async def stop(self, batch_id: str, reason: str, status_code: int, result: str) -> int:
        """Fail every line of the batch not yet run with `result` (a budget spent): none
        runs free. How many."""
        async with self._db.transaction() as tx:
            failed = await tx.execute(
                "UPDATE batch_lines SET state = ?, status_code = ?, result = ?, body = '' "
                "WHERE batch_id = ? AND state = ?",
                LineState.FAILED.value,
                status_code,
                result,
                batch_id,
                LineState.PENDING.value,
            )
            await tx.execute(
                "UPDATE batches SET failed = failed + ?, stopped_by = ? WHERE id = ?",
                failed,
                reason,
                batch_id,
            )
        return failed

    async def expire_due(self, now: float) -> dict[str, int]:
        """Batches whose window has ended: their lines not yet run expire, and they
        finalize `expired` with what they finished. Their ids, and the lines expired."""
        async with self._db.transaction() as tx:
            rows = await tx.fetch(
                "SELECT id FROM batches WHERE status IN (?, ?) AND expires_at <= ? "
                "AND final_status = ?",
                *_OPEN,
                now,
                BatchStatus.COMPLETED.value,
            )
            expired_lines: dict[str, int] = {}
            for (batch_id,) in rows:
                expired = expired_lines[batch_id] = await tx.execute(
                    "UPDATE batch_lines SET state = ?, result = ?, body = '' "
                    "WHERE batch_id = ? AND state = ?",
                    LineState.EXPIRED.value,
                    _EXPIRED,
                    batch_id,
                    LineState.PENDING.value,
                )
                await tx.execute(
                    "UPDATE batches SET final_status = ?, expired = expired + ? WHERE id = ?",
                    BatchStatus.EXPIRED.value,
                    expired,
                    batch_id,
                )
        return expired_lines

    async def sweep_ended(self) -> dict[LineState, int]:
        """Lines back to `pending` in a batch that is being cancelled or has expired (a
        line given back to wait, or reaped from a dead gateway, after the cancel or the
        expiry passed over it): cancelled or expired as the rest were, so that the batch
        can end. How many of each."""
        swept = {LineState.CANCELLED: 0, LineState.EXPIRED: 0}
        async with self._db.transaction() as tx:
            rows = await tx.fetch(
                "SELECT id, final_status FROM batches WHERE status IN (?, ?) "
                "AND final_status IN (?, ?)",
                *_OPEN,
                BatchStatus.CANCELLED.value,
                BatchStatus.EXPIRED.value,
            )
            for batch_id, final in rows:
                state = (
                    LineState.CANCELLED
                    if final == BatchStatus.CANCELLED.value
                    else LineState.EXPIRED
                )
                ended = await tx.execute(
                    "UPDATE batch_lines SET state = ?, result = ?, body = '' "
                    "WHERE batch_id = ? AND state = ?",
                    state.value,
                    _CANCELLED if state is LineState.CANCELLED else _EXPIRED,
                    batch_id,
                    LineState.PENDING.value,
                )
                if ended:
                    counter = state.value
                    await tx.execute(
                        f"UPDATE batches SET {counter} = {counter} + ? WHERE id = ?",
                        ended,
                        batch_id,
                    )
                    swept[state] += ended
        return swept

    async def finalizable(self, now: float) -> list[str]:
        """Batches whose every line is finished (or whose finalizer died): to finalize."""
        async with self._db.transaction() as tx:
            rows = await tx.fetch(
                "SELECT id FROM batches b WHERE (b.status IN (?, ?) AND NOT EXISTS ("
                "SELECT 1 FROM batch_lines l WHERE l.batch_id = b.id AND l.state IN (?, ?)))"
                " OR (b.status = ? AND b.finalizing_at < ?)",
                *_OPEN,
                LineState.PENDING.value,
                LineState.LEASED.value,
                BatchStatus.FINALIZING.value,
                now - FINALIZE_LEASE_S,
            )
        return [row[0] for row in rows]

    async def begin_finalize(self, batch_id: str, finalizer: str, now: float) -> bool:
        """Take the batch's finalizing (False: another gateway has it, or lines remain)."""
        async with self._db.transaction() as tx:
            changed = await tx.execute(
                "UPDATE batches SET status = ?, finalizing_at = ?, finalizer = ? "
                "WHERE id = ? AND ((status IN (?, ?) AND NOT EXISTS ("
                "SELECT 1 FROM batch_lines l WHERE l.batch_id = ? AND l.state IN (?, ?)))"
                " OR (status = ? AND finalizing_at < ?))",
                BatchStatus.FINALIZING.value,
                now,
                finalizer,
                batch_id,
                *_OPEN,
                batch_id,
                LineState.PENDING.value,
                LineState.LEASED.value,
                BatchStatus.FINALIZING.value,
                now - FINALIZE_LEASE_S,
            )
        return changed == 1

    async def results(self, batch_id: str) -> AsyncIterator[LineResult]:
        """The batch's finished lines, in input order, a page at a time."""
        last = 0
        while True:
            async with self._db.transaction() as tx:
                rows = await tx.fetch(
                    "SELECT line_no, custom_id, state, status_code, request_id, result "
                    "FROM batch_lines WHERE batch_id = ? AND line_no > ? ORDER BY line_no "
                    "LIMIT ?",
                    batch_id,
                    last,
                    _PAGE,
                )
            for line_no, custom_id, state, status_code, request_id, result in rows:
                yield LineResult(
                    int(line_no), custom_id, LineState(state), status_code, request_id, result
                )
            if len(rows) < _PAGE:
                return
            last = int(rows[-1][0])

    async def finish_finalize(
        self,
        batch: BatchRecord,
        finalizer: str,
        now: float,
        files: Sequence[FileRecord],
        output_file_id: str | None,
        error_file_id: str | None,
    ) -> bool:
        """Publish the batch's files and end it in its final status, if `finalizer` still
        holds its finalizing (False: taken over; the caller removes its files)."""
        final = batch.final_status
        stamp = {
            BatchStatus.COMPLETED: "completed_at",
            BatchStatus.CANCELLED: "cancelled_at",
            BatchStatus.EXPIRED: "expired_at",
        }[final]
        async with self._db.transaction() as tx:
            changed = await tx.execute(
                f"UPDATE batches SET status = ?, {stamp} = ?, output_file_id = ?, "
                "error_file_id = ? WHERE id = ? AND status = ? AND finalizer = ?",
                final.value,
                now,
                output_file_id,
                error_file_id,
                batch.id,
                BatchStatus.FINALIZING.value,
                finalizer,
            )
            if changed:
                for file in files:
                    await tx.execute(
                        f"INSERT INTO batch_files ({_FILE_COLUMNS}) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        *_file_row(file),
                    )
        return changed == 1


_AND_TENANT = {True: "", False: " AND tenant = ?"}
_CANCELLED = json.dumps(
    {"code": "batch_cancelled", "message": "The batch was cancelled before this request ran."}
)
_EXPIRED = json.dumps(
    {
        "code": "batch_expired",
        "message": "This request could not be executed before the completion window expired.",
    }
)


def _file_row(file: FileRecord) -> tuple[Any, ...]:
    return (
        file.id, file.tenant, file.owner, file.purpose, file.filename, file.bytes,
        file.created_at, file.expires_at, file.object_key,
    )  # fmt: skip


def _line_row(batch: BatchRecord, line: NewLine) -> tuple[Any, ...]:
    if line.failed is None:
        return (
            batch.id, line.line_no, line.custom_id, batch.tenant, line.model, line.body,
            LineState.PENDING.value, None, None,
        )  # fmt: skip
    return (
        batch.id, line.line_no, line.custom_id, batch.tenant, line.model, "",
        LineState.FAILED.value, line.status_code, line.failed,
    )  # fmt: skip


def _file(row: Row) -> FileRecord:
    return FileRecord(
        row[0], row[1], row[2], row[3], row[4], int(row[5]), float(row[6]),
        None if row[7] is None else float(row[7]), row[8],
    )  # fmt: skip


def _batch_row(batch: BatchRecord, failed: int) -> tuple[Any, ...]:
    return (
        batch.id, batch.api.value, batch.tenant, batch.key_id, batch.endpoint,
        batch.input_file_id, batch.completion_window, batch.status.value,
        batch.final_status.value, batch.created_at, batch.expires_at, batch.counts.total,
        0, failed, 0, 0, 0, 0, 0, json.dumps(list(batch.models)),
        None if batch.metadata is None else json.dumps(batch.metadata),
        None if batch.errors is None else json.dumps(batch.errors),
        None, None, batch.in_progress_at, None, None, batch.failed_at, None, None, None, None,
        batch.output_ttl_s,
    )  # fmt: skip


def _time(value: Any) -> float | None:
    return None if value is None else float(value)


def _batch(row: Row) -> BatchRecord:
    return BatchRecord(
        id=row[0],
        api=BatchApi(row[1]),
        tenant=row[2],
        key_id=row[3],
        endpoint=row[4],
        input_file_id=row[5],
        completion_window=row[6],
        status=BatchStatus(row[7]),
        final_status=BatchStatus(row[8]),
        created_at=float(row[9]),
        expires_at=float(row[10]),
        counts=LineCounts(int(row[11]), int(row[12]), int(row[13]), int(row[14]), int(row[15])),
        tokens=TokenCounts(int(row[16]), int(row[17]), int(row[18])),
        models=tuple(json.loads(row[19])),
        metadata=None if row[20] is None else json.loads(row[20]),
        errors=None if row[21] is None else json.loads(row[21]),
        output_file_id=row[22],
        error_file_id=row[23],
        in_progress_at=_time(row[24]),
        finalizing_at=_time(row[25]),
        completed_at=_time(row[26]),
        failed_at=_time(row[27]),
        expired_at=_time(row[28]),
        cancelling_at=_time(row[29]),
        cancelled_at=_time(row[30]),
        stopped_by=row[31],
        output_ttl_s=float(row[32]),
    )
