"""The batch store on SQLite and on a real PostgreSQL (127.0.0.1:5432, a database of the
test's own): leases, takeover, exactly one answer per line, tenant limits, cancel, expiry,
finalizing once."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.batches.batch_records import (
    BatchApi,
    BatchRecord,
    BatchStatus,
    FileRecord,
    LineCounts,
    LineState,
    LineUsage,
    NewLine,
)
from gateway.batches.batch_store import BatchStore, NotCancellable, NotDeletable
from tests.postgres import own_database

T0 = 1_800_000_000.0


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[BatchStore]:
    if request.param == "sqlite":
        opened = BatchStore(f"sqlite:///{tmp_path}/batches.db")
        yield opened
        await opened.close()
        return
    async with own_database("batches_test") as url:
        opened = BatchStore(url)
        try:
            yield opened
        finally:
            await opened.close()


def _batch(batch_id: str, tenant: str = "acme", total: int = 3, at: float = T0) -> BatchRecord:
    return BatchRecord(
        id=batch_id, api=BatchApi.OPENAI, tenant=tenant, key_id="k1",
        endpoint="/v1/chat/completions", input_file_id="file-in", completion_window="24h",
        status=BatchStatus.IN_PROGRESS, created_at=at, expires_at=at + 86400,
        counts=LineCounts(total=total), models=("llm-small",), in_progress_at=at,
    )  # fmt: skip


def _lines(n: int, failed: int = 0) -> list[NewLine]:
    lines = [NewLine(i, f"req-{i}", "llm-small", '{"model": "llm-small"}') for i in range(1, n + 1)]
    lines += [
        NewLine(n + i, f"bad-{i}", "", "", failed='{"code": "invalid_json", "message": "x"}')
        for i in range(1, failed + 1)
    ]
    return lines


async def test_a_line_is_answered_once_even_when_its_lease_was_taken_over(
    store: BatchStore,
) -> None:
    batch = _batch("batch_1", total=2)
    await store.create_batch(batch, _lines(2))
    first = await store.claim(batch, "llm-small", "lease-a", T0, 10, None)
    assert first is not None and first.line_no == 1 and first.attempts == 1
    # Its gateway stalls past the lease: the line goes back and another takes it.
    assert await store.reap(T0 + 11) == 1
    again = await store.claim(batch, "llm-small", "lease-b", T0 + 11, 10, None)
    assert again is not None and again.line_no == 1 and again.attempts == 2
    usage = LineUsage(5, 0, 2)
    assert await store.commit(again, LineState.DONE, 200, "r-b", '{"b": 1}', usage)
    # The first gateway's late answer is dropped, not written twice.
    assert not await store.commit(first, LineState.DONE, 200, "r-a", '{"a": 1}', usage)
    recorded = await store.batch("acme", "batch_1", BatchApi.OPENAI)
    assert recorded is not None and recorded.counts.done == 1
    assert recorded.tokens.input_tokens == 5 and recorded.tokens.output_tokens == 2
    results = [r async for r in store.results("batch_1")]
    assert [(r.line_no, r.state, r.result) for r in results] == [
        (1, LineState.DONE, '{"b": 1}'),
        (2, LineState.PENDING, None),
    ]


async def test_a_tenant_holds_at_most_its_limit_of_lines_across_batches(
    store: BatchStore,
) -> None:
    one, two = _batch("batch_1", total=3), _batch("batch_2", total=3, at=T0 + 1)
    await store.create_batch(one, _lines(3))
    await store.create_batch(two, _lines(3))
    held = [await store.claim(one, "llm-small", f"l{i}", T0, 60, 2) for i in range(2)]
    assert all(line is not None for line in held)
    assert await store.claim(two, "llm-small", "l3", T0, 60, 2) is None
    other = _batch("batch_3", tenant="globex")
    await store.create_batch(other, _lines(3))
    assert await store.claim(other, "llm-small", "l4", T0, 60, 2) is not None
    first = held[0]
    assert first is not None
    await store.commit(first, LineState.FAILED, 400, "r", "{}", LineUsage())
    assert await store.claim(two, "llm-small", "l5", T0, 60, 2) is not None


async def test_cancel_ends_what_has_not_run_and_a_finished_batch_cannot_be_cancelled(
    store: BatchStore,
) -> None:
    batch = _batch("batch_1", total=3)
    await store.create_batch(batch, _lines(3))
    running = await store.claim(batch, "llm-small", "lease", T0, 60, None)
    assert running is not None
    assert await store.cancel("globex", "batch_1", BatchApi.OPENAI, T0) == 0  # not its batch
    assert await store.finalizable(T0) == []
    assert await store.cancel("acme", "batch_1", BatchApi.OPENAI, T0 + 1) == 2
    cancelling = await store.batch("acme", "batch_1", BatchApi.OPENAI)
    assert cancelling is not None and cancelling.status is BatchStatus.CANCELLING
    assert cancelling.counts.cancelled == 2
    # The running line finishes; then the batch finalizes, once.
    await store.commit(running, LineState.DONE, 200, "r", "{}", LineUsage())
    assert await store.finalizable(T0 + 2) == ["batch_1"]
    assert await store.begin_finalize("batch_1", "w1", T0 + 2)
    assert not await store.begin_finalize("batch_1", "w2", T0 + 2)
    out = FileRecord("file-out", "acme", "k1", "batch_output", "o.jsonl", 3, T0, None, "acme/o")
    assert not await store.finish_finalize(cancelling, "w2", T0 + 3, [out], "file-out", None)
    assert await store.finish_finalize(cancelling, "w1", T0 + 3, [out], "file-out", None)
    ended = await store.batch("acme", "batch_1", BatchApi.OPENAI)
    assert ended is not None and ended.status is BatchStatus.CANCELLED
    assert ended.output_file_id == "file-out" and ended.cancelled_at == T0 + 3
    assert await store.file("acme", "file-out") == out
    await store.cancel("acme", "batch_1", BatchApi.OPENAI, T0 + 4)  # asked again: the same
    again = await store.batch("acme", "batch_1", BatchApi.OPENAI)
    assert again is not None and again.status is BatchStatus.CANCELLED


async def test_a_batch_past_its_window_expires_its_unrun_lines(store: BatchStore) -> None:
    batch = _batch("batch_1", total=3)
    await store.create_batch(batch, _lines(3))
    line = await store.claim(batch, "llm-small", "lease", T0, 60, None)
    assert line is not None
    await store.commit(line, LineState.DONE, 200, "r", "{}", LineUsage())
    assert await store.expire_due(T0 + 86399) == {}
    assert await store.expire_due(T0 + 86400) == {"batch_1": 2}
    expired = await store.batch("acme", "batch_1", BatchApi.OPENAI)
    assert expired is not None and expired.final_status is BatchStatus.EXPIRED
    assert (expired.counts.done, expired.counts.expired) == (1, 2)
    assert await store.claim(batch, "llm-small", "l2", T0, 60, None) is None
    assert await store.finalizable(T0 + 86400) == ["batch_1"]


async def test_a_stopped_batch_fails_every_line_not_yet_run(store: BatchStore) -> None:
    batch = _batch("batch_1", total=4)
    await store.create_batch(batch, _lines(3, failed=1))
    assert (await store.batch("acme", "batch_1", BatchApi.OPENAI)).counts.failed == 1  # type: ignore[union-attr]
    assert await store.stop("batch_1", "budget", 429, '{"error": {}}') == 3
    stopped = await store.batch("acme", "batch_1", BatchApi.OPENAI)
    assert stopped is not None and stopped.counts.failed == 4 and stopped.stopped_by == "budget"
    assert await store.begin_finalize("batch_1", "w1", T0)
    assert await store.finish_finalize(stopped, "w1", T0, [], None, "file-err")
    with pytest.raises(NotCancellable) as refused:
        await store.cancel("acme", "batch_1", BatchApi.OPENAI, T0 + 4)
    assert refused.value.status is BatchStatus.COMPLETED


async def test_files_and_batches_page_newest_first_and_stay_their_tenants(
    store: BatchStore,
) -> None:
    for i in range(5):
        await store.add_file(
            FileRecord(f"file-{i}", "acme", "k1", "batch", "in.jsonl", 10, T0 + i, None, f"a/{i}")
        )
        await store.create_batch(_batch(f"batch_{i}", at=T0 + i), _lines(1))
    page, more = await store.files("acme", purpose="batch", after=None, limit=2, newest_first=True)
    assert [f.id for f in page] == ["file-4", "file-3"] and more
    page, more = await store.files("acme", purpose=None, after="file-3", limit=5, newest_first=True)
    assert [f.id for f in page] == ["file-2", "file-1", "file-0"] and not more
    assert await store.files("globex", purpose=None, after=None, limit=5, newest_first=True) == (
        [],
        False,
    )
    assert await store.file("globex", "file-1") is None
    batches, more = await store.batches("acme", BatchApi.OPENAI, after="batch_3", limit=2)
    assert [b.id for b in batches] == ["batch_2", "batch_1"] and more
    batches, more = await store.batches("acme", BatchApi.OPENAI, before="batch_1", limit=2)
    assert [b.id for b in batches] == ["batch_3", "batch_2"] and more
    assert await store.batch("globex", "batch_1", BatchApi.OPENAI) is None
    assert await store.batch("acme", "batch_1", BatchApi.ANTHROPIC) is None
    deleted = await store.delete_file("acme", "file-1", T0 + 10)
    assert deleted is not None and await store.file("acme", "file-1") is None
    with pytest.raises(NotDeletable):
        await store.delete_batch("acme", "batch_1", BatchApi.OPENAI, T0)


async def test_a_line_given_back_after_the_cancel_is_cancelled_too(store: BatchStore) -> None:
    batch = _batch("batch_1", total=2)
    await store.create_batch(batch, _lines(2))
    running = await store.claim(batch, "llm-small", "lease", T0, 60, None)
    assert running is not None
    assert await store.cancel("acme", "batch_1", BatchApi.OPENAI, T0 + 1) == 1
    # The running line came back "wait" after the cancel: it is back to pending ...
    await store.release(running, T0 + 2)
    assert await store.finalizable(T0 + 3) == []
    # ... until the sweep ends it as the cancel ended the others; then the batch ends.
    assert await store.sweep_ended() == {LineState.CANCELLED: 1, LineState.EXPIRED: 0}
    cancelled = await store.batch("acme", "batch_1", BatchApi.OPENAI)
    assert cancelled is not None and cancelled.counts.cancelled == 2
    assert await store.finalizable(T0 + 3) == ["batch_1"]


async def test_an_expired_file_is_gone_to_its_tenant_and_left_for_the_sweeper(
    store: BatchStore,
) -> None:
    now = time.time()
    kept = FileRecord("file-kept", "acme", "k1", "batch", "a", 100, now, now + 3600, "acme/a")
    old = FileRecord("file-old", "acme", "k1", "batch", "b", 50, now - 7200, now - 3600, "acme/b")
    await store.add_file(kept)
    await store.add_file(old)
    assert await store.file("acme", "file-old") is None
    assert await store.file("acme", "file-kept") == kept
    listed, _ = await store.files("acme", purpose=None, after=None, limit=10, newest_first=True)
    assert [f.id for f in listed] == ["file-kept"]
    assert await store.file_bytes("acme") == 100
    assert await store.expired_files(now) == [old]
    assert await store.delete_file("acme", "file-old", now) == old
    assert await store.expired_files(now) == []
