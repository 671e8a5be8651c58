"""The worker on a real batch store (SQLite) and object store, its lines run by a
stand-in runner: fair among tenants, waits, a spent budget stops a batch, every batch
finalized with its files."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.batches.batch_records import (
    BatchApi,
    BatchRecord,
    BatchStatus,
    ClaimedLine,
    LineCounts,
    NewLine,
)
from gateway.batches.batch_store import BatchStore
from gateway.batches.batch_worker import BatchWorker, LineOutcome, Outcome, WorkerSettings
from gateway.batches.object_store import DirectoryStore, read_all
from tests.polling import wait_until

SETTINGS = WorkerSettings(poll_s=0.01, housekeeping_s=0.05, lease_s=30, max_lines=64)


class Slots:
    """A model with `free` slots for batch lines, whatever runs."""

    def __init__(self, free: int) -> None:
        self.free = free

    def free_for_batch(self, model: str, mine: int) -> int:
        return max(0, self.free - mine)


class Runner:
    """Answers each line after `delay_s`; by custom_id, a wait or a spent budget."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.order: list[str] = []

    async def __call__(self, batch: BatchRecord, line: ClaimedLine) -> LineOutcome:
        self.order.append(f"{batch.tenant}:{line.custom_id}")
        await asyncio.sleep(self.delay_s)
        if line.custom_id.startswith("wait") and self.order.count(self.order[-1]) <= 7:
            # Refused for a limit seven times: each time it waits, and runs again.
            return LineOutcome(Outcome.RETRY, 429, retry_after_s=0.01)
        if line.custom_id == "broke":
            return LineOutcome(
                Outcome.STOP, 429, "r", '{"error": {"code": "insufficient_quota"}}', reason="budget"
            )
        return LineOutcome(Outcome.ANSWERED, 200, f"req-{line.line_no}", '{"ok": true}')


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[BatchStore]:
    opened = BatchStore(f"sqlite:///{tmp_path}/batches.db")
    yield opened
    await opened.close()


async def _make(store: BatchStore, batch_id: str, tenant: str, custom_ids: list[str]) -> None:
    now = time.time()
    batch = BatchRecord(
        id=batch_id, api=BatchApi.OPENAI, tenant=tenant, key_id="k",
        endpoint="/v1/chat/completions", input_file_id="file-in", completion_window="24h",
        status=BatchStatus.IN_PROGRESS,
        created_at=now, expires_at=now + 3600, counts=LineCounts(total=len(custom_ids)),
        models=("llm",), in_progress_at=now,
    )  # fmt: skip
    lines = [NewLine(i + 1, cid, "llm", "{}") for i, cid in enumerate(custom_ids)]
    await store.create_batch(batch, lines)


async def _ended(store: BatchStore, batch_id: str) -> BatchRecord:
    async def ended() -> bool:
        batch = await store.batch(None, batch_id, BatchApi.OPENAI)
        return batch is not None and batch.status.ended

    await wait_until(ended, timeout_s=10)
    batch = await store.batch(None, batch_id, BatchApi.OPENAI)
    assert batch is not None
    return batch


async def test_tenants_take_turns_whoever_submitted_first(
    store: BatchStore, tmp_path: Path
) -> None:
    await _make(store, "batch_a", "acme", [f"a{i}" for i in range(20)])
    await _make(store, "batch_b", "globex", [f"b{i}" for i in range(20)])
    runner = Runner(delay_s=0.01)
    worker = BatchWorker(
        store, DirectoryStore(tmp_path / "files"), runner, Slots(2), SETTINGS, lambda t: None
    )
    worker.start()
    try:
        await _ended(store, "batch_a")
        await _ended(store, "batch_b")
    finally:
        await worker.stop()
    firsts = [entry.split(":")[0] for entry in runner.order[:20]]
    # Two slots: one line of each tenant at a time, not acme's whole batch first.
    assert abs(firsts.count("acme") - firsts.count("globex")) <= 2


async def test_a_line_that_must_wait_runs_again_and_a_spent_budget_stops_the_rest(
    store: BatchStore, tmp_path: Path
) -> None:
    await _make(store, "batch_w", "acme", ["wait-1", "x", "y"])
    await _make(store, "batch_s", "globex", ["broke", *(f"n{i}" for i in range(10))])
    runner = Runner()
    objects = DirectoryStore(tmp_path / "files")
    worker = BatchWorker(store, objects, runner, Slots(1), SETTINGS, lambda t: None)
    worker.start()
    try:
        waited = await _ended(store, "batch_w")
        stopped = await _ended(store, "batch_s")
    finally:
        await worker.stop()
    assert waited.status is BatchStatus.COMPLETED and waited.counts.done == 3
    assert runner.order.count("acme:wait-1") == 8  # a wait is no attempt lost
    assert stopped.stopped_by == "budget"
    assert (stopped.counts.done, stopped.counts.failed) == (0, 11)
    assert stopped.error_file_id is not None and stopped.output_file_id is None
    file = await store.file("globex", stopped.error_file_id)
    assert file is not None
    errors = [json.loads(line) for line in (await read_all(objects, file.object_key)).splitlines()]
    assert len(errors) == 11
    assert {e["response"]["body"]["error"]["code"] for e in errors} == {"insufficient_quota"}
    assert not any(entry.startswith("globex:n") for entry in runner.order)  # none ran free


async def test_a_tenant_at_its_line_limit_waits_for_its_own_to_end(
    store: BatchStore, tmp_path: Path
) -> None:
    await _make(store, "batch_a", "acme", [f"a{i}" for i in range(6)])
    running: list[int] = []
    most = 0

    class Counting(Runner):
        async def __call__(self, batch: BatchRecord, line: ClaimedLine) -> LineOutcome:
            nonlocal most
            running.append(1)
            most = max(most, len(running))
            await asyncio.sleep(0.02)
            running.pop()
            return LineOutcome(Outcome.ANSWERED, 200, "r", "{}")

    worker = BatchWorker(
        store, DirectoryStore(tmp_path / "f"), Counting(), Slots(8), SETTINGS, lambda t: 2
    )
    worker.start()
    try:
        assert (await _ended(store, "batch_a")).counts.done == 6
    finally:
        await worker.stop()
    assert most == 2
