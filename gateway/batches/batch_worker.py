"""The batch worker: every gateway runs one, taking batch lines onto idle capacity only.

Each tick (`poll_s`, and at once when one of its lines ends) it looks, model by model,
at what admission holds (`IdleSlots`): while no online request waits and slots are
free beyond those its own lines already hold or are about to take, it claims lines
from the store and runs them (`LineRunner`, the API layer's: each line one request
through the conductor, at the batch class below every online one). A line that enters
admission behind online traffic waits there at the lowest class; a running line is
never cut for an online one, which waits one line's service time at most.

Among tenants, the next line goes to the tenant with the fewest lines running here
(then the oldest batch); across gateways, a tenant's `batch.max_concurrent_lines` holds
exactly (`BatchStore.claim`). Every `housekeeping_s` it also puts dead gateways' lines
back (`reap`), expires batches past their window, finalizes batches whose lines are all
done (their output and error files written to the object store), and extends the
leases of the lines it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from gateway.batches.batch_output import anthropic_line, openai_line
from gateway.batches.batch_records import (
    BatchApi,
    BatchRecord,
    BatchStatus,
    ClaimedLine,
    FileRecord,
    LineState,
    LineUsage,
)
from gateway.batches.batch_store import BatchStore
from gateway.batches.object_store import ObjectStore
from gateway.inference.ids import random_id, unique_id
from gateway.observability import metrics

log = logging.getLogger("gateway.batches")

# A line taken over this many times (each time its gateway died running it) is failed,
# not run again: it may be what kills them.
MAX_ATTEMPTS = 5
RESULTS_PURPOSE = "batch_output"
# Anthropic's results, stored as a file the Files API does not show.
ANTHROPIC_RESULTS_PURPOSE = "message_batch_results"


class Outcome(Enum):
    """What became of a line's run."""

    ANSWERED = "answered"  # an answer to record: 2xx done, else failed
    RETRY = "retry"  # a limit or capacity said wait: run it again later
    STOP = "stop"  # the key's budget is spent: fail it and every line not yet run


@dataclass(frozen=True, slots=True)
class LineOutcome:
    """A line's run, as the worker records it."""

    outcome: Outcome
    status_code: int = 0
    request_id: str = ""
    # The answer's or the error's JSON body.
    result: str = ""
    usage: LineUsage = field(default_factory=LineUsage)
    # RETRY: seconds to wait before running it again.
    retry_after_s: float = 0.0
    # STOP: why (`budget`...), as the batch records it.
    reason: str = ""
    # ANSWERED: how long the tenant's lines wait before the next (its rate-limit buckets
    # are nearly spent: the rest is its online requests').
    pause_s: float = 0.0


class LineRunner(Protocol):
    """Runs one line of a batch as one request of the batch's key."""

    def __call__(self, batch: BatchRecord, line: ClaimedLine) -> Awaitable[LineOutcome]: ...


class IdleSlots(Protocol):
    """What admission holds for a model, seen by the worker."""

    def free_for_batch(self, model: str, mine: int) -> int:
        """Slots free for more batch lines now: 0 while an online request waits; else the
        free slots, less those of this gateway's `mine` batch lines not holding one yet."""
        ...


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """How a worker paces itself (gateway.yaml `batches:`)."""

    poll_s: float = 0.1
    housekeeping_s: float = 1.0
    lease_s: float = 60.0
    # The lines this gateway runs at once, at most, all models together.
    max_lines: int = 256


class BatchWorker:
    """One gateway's share of the batch work."""

    def __init__(
        self,
        store: BatchStore,
        objects: ObjectStore,
        run_line: LineRunner,
        idle: IdleSlots,
        settings: WorkerSettings,
        tenant_limit: Callable[[str], int | None],
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store, self._objects, self._run_line = store, objects, run_line
        self._idle, self._settings, self._tenant_limit = idle, settings, tenant_limit
        self._clock = clock
        self.name = f"worker-{unique_id()}"
        self._running: list[BatchRecord] = []
        # This gateway's lines: by lease, and how many per model and per tenant.
        self._lines: dict[str, tuple[ClaimedLine, asyncio.Task[None]]] = {}
        self._by_model: dict[str, int] = {}
        self._by_tenant: dict[str, int] = {}
        # (batch, model) pairs found with nothing ready, until the next housekeeping.
        self._drained: set[tuple[str, str]] = set()
        # Tenants whose limits said wait, until when: none of their lines is claimed
        # meanwhile (one refused line stands for the others, which would be refused too).
        self._paused: dict[str, float] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start working (on the running event loop)."""
        for outcome in ("retried", *(s.value for s in LineState if s.ended)):
            metrics.labels(metrics.BATCH_LINES, outcome)  # each shown at 0 from the start
        self._task = asyncio.create_task(self._work(), name="batch-worker")

    def wake(self) -> None:
        """Look for work now (a batch was just made here)."""
        self._wake.set()

    async def stop(self) -> None:
        """Stop: lines running here are cancelled and given back at once (another
        gateway takes them without waiting for their leases)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        lines = list(self._lines.values())
        for _, task in lines:
            task.cancel()
        for line, task in lines:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            with contextlib.suppress(Exception):
                await self._store.release(line, 0.0)

    async def _work(self) -> None:
        next_housekeeping = 0.0
        while True:
            try:
                now = self._clock()
                if now >= next_housekeeping:
                    await self._housekeep(now)
                    next_housekeeping = now + self._settings.housekeeping_s
                await self._launch(now)
            except asyncio.CancelledError:
                raise
            except Exception:
                # The database away: try again at the next tick, nothing lost (leases).
                log.exception("batch worker: a tick failed")
                await asyncio.sleep(self._settings.housekeeping_s)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._settings.poll_s)

    async def _housekeep(self, now: float) -> None:
        store = self._store
        await store.reap(now)
        for lines in (await store.expire_due(now)).values():
            metrics.labels(metrics.BATCH_LINES, "expired").inc(lines)
        for state, lines in (await store.sweep_ended()).items():
            metrics.labels(metrics.BATCH_LINES, state.value).inc(lines)
        for file in await store.expired_files(now):
            await self._objects.delete(file.object_key)
            await store.delete_file(file.tenant, file.id, now)
        await store.extend(list(self._lines), now + self._settings.lease_s)
        for batch_id in await store.finalizable(now):
            await self.finalize(batch_id, now)
        self._running = await store.running()
        self._drained.clear()
        counts = await store.count_by_status()
        for status in BatchStatus:
            metrics.labels(metrics.BATCHES, status.value).set(counts.get(status.value, 0))

    async def _launch(self, now: float) -> None:
        models = {model for batch in self._running for model in batch.models}
        for model in sorted(models):
            free = self._idle.free_for_batch(model, self._by_model.get(model, 0))
            while free > 0 and len(self._lines) < self._settings.max_lines:
                line = await self._claim_next(model, now)
                if line is None:
                    break
                free -= 1

    async def _claim_next(self, model: str, now: float) -> tuple[BatchRecord, ClaimedLine] | None:
        """A line for `model`: of the tenant with the fewest lines running here, its
        oldest batch first."""
        candidates = [
            b
            for b in self._running
            if model in b.models
            and (b.id, model) not in self._drained
            and self._paused.get(b.tenant, 0.0) <= now
        ]
        candidates.sort(key=lambda b: (self._by_tenant.get(b.tenant, 0), b.created_at))
        skipped_tenants: set[str] = set()
        for batch in candidates:
            if batch.tenant in skipped_tenants:
                continue
            line = await self._store.claim(
                batch, model, random_id(), now, self._settings.lease_s,
                self._tenant_limit(batch.tenant),
            )  # fmt: skip
            if line is None:
                # Nothing ready in this batch (or its tenant at its limit: its other
                # batches wait too, until a line of its ends).
                self._drained.add((batch.id, model))
                skipped_tenants.add(batch.tenant)
                continue
            self._begin(batch, line)
            return batch, line
        return None

    def _begin(self, batch: BatchRecord, line: ClaimedLine) -> None:
        self._by_model[line.model] = self._by_model.get(line.model, 0) + 1
        self._by_tenant[batch.tenant] = self._by_tenant.get(batch.tenant, 0) + 1
        task = asyncio.create_task(self._run(batch, line), name=f"batch-line-{line.line_no}")
        self._lines[line.lease] = (line, task)

    async def _run(self, batch: BatchRecord, line: ClaimedLine) -> None:
        try:
            if line.attempts > MAX_ATTEMPTS:
                outcome = _too_many_attempts(batch)
            else:
                outcome = await self._run_line(batch, line)
            await self._record(batch, line, outcome)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("batch %s line %d: not recorded; it runs again", batch.id, line.line_no)
            with contextlib.suppress(Exception):
                await self._store.release(line, self._clock() + self._settings.housekeeping_s)
        finally:
            self._lines.pop(line.lease, None)
            self._by_model[line.model] -= 1
            self._by_tenant[batch.tenant] -= 1
            self._drained.discard((batch.id, line.model))
            self._wake.set()

    async def _record(self, batch: BatchRecord, line: ClaimedLine, outcome: LineOutcome) -> None:
        store = self._store
        if outcome.outcome is Outcome.RETRY:
            until = self._pause(batch.tenant, outcome.retry_after_s)
            await store.release(line, until)
            self._told(None)
            return
        if outcome.pause_s > 0:
            self._pause(batch.tenant, outcome.pause_s)
        state = LineState.DONE if 200 <= outcome.status_code < 300 else LineState.FAILED
        recorded = await store.commit(
            line, state, outcome.status_code, outcome.request_id, outcome.result, outcome.usage
        )
        if recorded:
            self._told(state, outcome.usage)
        if outcome.outcome is Outcome.STOP:
            stopped = await store.stop(
                batch.id, outcome.reason, outcome.status_code, outcome.result
            )
            for _ in range(stopped):
                self._told(LineState.FAILED)
            self._running = [b for b in self._running if b.id != batch.id]

    def _pause(self, tenant: str, seconds: float) -> float:
        """No line of `tenant` is claimed for `seconds`; until when."""
        until = self._clock() + seconds
        self._paused[tenant] = max(self._paused.get(tenant, 0.0), until)
        return until

    def _told(self, state: LineState | None, usage: LineUsage | None = None) -> None:
        """Count a line that ended here (None: given back to wait)."""
        metrics.labels(metrics.BATCH_LINES, "retried" if state is None else state.value).inc()
        if usage is not None:
            metrics.labels(metrics.BATCH_TOKENS, "input").inc(usage.input_tokens)
            metrics.labels(metrics.BATCH_TOKENS, "output").inc(usage.output_tokens)

    async def finalize(self, batch_id: str, now: float) -> bool:
        """Write a batch's files and end it, if this worker takes its finalizing."""
        store = self._store
        if not await store.begin_finalize(batch_id, self.name, now):
            return False
        batch = await store.batch(None, batch_id, _ANY_API[0])
        if batch is None:
            batch = await store.batch(None, batch_id, _ANY_API[1])
        if batch is None:
            return False
        files, output_id, error_id = await self._write_results(batch, now)
        if not await store.finish_finalize(batch, self.name, now, files, output_id, error_id):
            for file in files:  # another gateway took over: its files are the batch's
                await self._objects.delete(file.object_key)
            return False
        log.info("batch %s: %s", batch.id, batch.final_status.value)
        return True

    async def _write_results(
        self, batch: BatchRecord, now: float
    ) -> tuple[list[FileRecord], str | None, str | None]:
        """The batch's results as files in the object store: OpenAI's output and error
        files (each only if it has a line), or Anthropic's one results file."""
        if batch.api is BatchApi.ANTHROPIC:
            results = await self._write(batch, now, ANTHROPIC_RESULTS_PURPOSE, "results", None)
            assert results is not None
            return [results], results.id, None
        output = await self._write(batch, now, RESULTS_PURPOSE, "output", True)
        errors = await self._write(batch, now, RESULTS_PURPOSE, "error", False)
        files = [f for f in (output, errors) if f is not None]
        return files, None if output is None else output.id, None if errors is None else errors.id

    async def _write(
        self, batch: BatchRecord, now: float, purpose: str, kind: str, good: bool | None
    ) -> FileRecord | None:
        """One results file: the lines that are `good` (None: all); None if it has none."""
        file_id = f"file-{random_id()}"
        key = f"{batch.tenant}/{file_id}"
        written = 0

        async def lines() -> AsyncIterator[bytes]:
            nonlocal written
            async for result in self._store.results(batch.id):
                if good is None:
                    yield anthropic_line(result)
                    written += 1
                    continue
                into_output, line = openai_line(batch.id, result)
                if into_output is good:
                    written += 1
                    yield line

        size = await self._objects.put(key, lines())
        if written == 0 and good is not None:
            await self._objects.delete(key)
            return None
        return FileRecord(
            file_id, batch.tenant, batch.key_id, purpose, f"batch_{batch.id}_{kind}.jsonl",
            size, now, now + batch.output_ttl_s, key,
        )  # fmt: skip


_ANY_API = (BatchApi.OPENAI, BatchApi.ANTHROPIC)


def _too_many_attempts(batch: BatchRecord) -> LineOutcome:
    message = (
        f"The request was started {MAX_ATTEMPTS} times and its gateway stopped each time; "
        "it is not run again."
    )
    error: dict[str, object] = {
        "error": {"message": message, "type": "server_error", "param": None, "code": None}
    }
    if batch.api is BatchApi.ANTHROPIC:
        error = {"type": "error", "error": {"type": "api_error", "message": message}}
    return LineOutcome(Outcome.ANSWERED, 500, "", json.dumps(error))
