"""The usage journal on a real directory: what a process that ended without closing
left is what the next one recovers, each request once, its last word kept."""

from __future__ import annotations

from pathlib import Path

from gateway.ledger.usage_journal import CUT_BY_EXIT, UsageJournal
from tests.unit.ledger.usage_samples import sample


def test_a_process_that_ended_leaves_its_finished_and_in_flight_requests(
    tmp_path: Path,
) -> None:
    journal = UsageJournal(tmp_path)
    assert journal.recover() == []
    journal.in_flight(sample(1, status=0, completion_tokens=0))
    journal.finished(sample(1))  # dispatched, then finished
    journal.in_flight(sample(2, status=0, completion_tokens=0))
    journal.in_flight(sample(2, status=0, completion_tokens=64))  # a stream, further on
    journal.in_flight(sample(3, status=200))  # answered, not yet sent
    journal.finished(sample(4))  # refused before dispatch: a final line only
    # The process ends here, without close().
    recovered = {r.request_id: r for r in UsageJournal(tmp_path).recover()}
    assert recovered["r-1"] == sample(1)
    assert (recovered["r-2"].status, recovered["r-2"].completion_tokens) == (CUT_BY_EXIT, 64)
    assert recovered["r-3"].status == CUT_BY_EXIT
    assert recovered["r-4"] == sample(4)
    assert len(recovered) == 4


def test_a_final_line_is_the_last_word_whatever_follows(tmp_path: Path) -> None:
    journal = UsageJournal(tmp_path)
    journal.finished(sample(1))
    journal.in_flight(sample(1, status=0))  # a late progress line (never written so)
    [record] = UsageJournal(tmp_path).recover()
    assert record == sample(1)


def test_a_line_cut_short_by_the_end_of_the_process_is_left_out(tmp_path: Path) -> None:
    journal = UsageJournal(tmp_path)
    journal.finished(sample(1))
    journal.finished(sample(2))
    journal.close()
    [path] = list(tmp_path.glob("journal-*.jsonl"))
    path.write_bytes(path.read_bytes()[:-20])  # the second line half-written
    assert [r.request_id for r in UsageJournal(tmp_path).recover()] == ["r-1"]


def test_compacting_keeps_only_what_is_in_flight_or_undelivered(tmp_path: Path) -> None:
    journal = UsageJournal(tmp_path, compact_bytes=1)
    journal.recover()
    for i in range(50):
        journal.in_flight(sample(i, status=0))
        journal.finished(sample(i))
    journal.in_flight(sample(50, status=0))  # still running
    assert journal.due
    journal.compact([sample(49)])  # delivered all but the last finished
    assert len(list(tmp_path.glob("journal-*.jsonl"))) == 1
    recovered = {r.request_id: r for r in UsageJournal(tmp_path).recover()}
    assert set(recovered) == {"r-49", "r-50"}
    assert recovered["r-50"].status == CUT_BY_EXIT
    # Finished after compacting: the next file, read after the compacted one.
    journal.finished(sample(50))
    recovered = {r.request_id: r for r in UsageJournal(tmp_path).recover()}
    assert recovered["r-50"] == sample(50)


def test_nothing_left_after_a_clean_close(tmp_path: Path) -> None:
    journal = UsageJournal(tmp_path)
    journal.recover()
    journal.in_flight(sample(1, status=0))
    journal.finished(sample(1))
    journal.compact(())
    journal.close()
    assert list(tmp_path.glob("journal-*.jsonl")) == []
    assert UsageJournal(tmp_path).recover() == []


def test_a_disk_that_refuses_costs_the_journal_not_the_request(tmp_path: Path) -> None:
    journal = UsageJournal(tmp_path / "gone")  # recover() never made it: writes fail
    journal.finished(sample(1))
    journal.in_flight(sample(2, status=0))
    assert journal.failures == 2
