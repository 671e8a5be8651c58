from __future__ import annotations

from pathlib import Path

import pytest

from gateway.ledger.usage_spool import SpoolInUse, UsageSpool
from tests.unit.ledger.usage_samples import T0, sample


def test_records_come_back_in_order_and_the_file_goes(tmp_path: Path) -> None:
    spool = UsageSpool(tmp_path, 1 << 20)
    spool.load()
    assert spool.append([sample(i) for i in range(5)]) == 0
    assert spool.append([sample(i) for i in range(5, 8)]) == 0
    assert spool.records == 8
    assert spool.oldest_ts == T0
    segment = spool.oldest()
    assert segment is not None
    assert spool.read(segment) == [sample(i) for i in range(8)]
    spool.remove(segment)
    assert (spool.records, spool.size, spool.oldest()) == (0, 0, None)
    assert list(tmp_path.glob("*.jsonl")) == []


def test_what_does_not_fit_is_refused_and_counted(tmp_path: Path) -> None:
    spool = UsageSpool(tmp_path, 4096)
    spool.load()
    refused = spool.append([sample(i) for i in range(100)])
    assert 0 < refused < 100
    assert spool.records == 100 - refused
    assert spool.size <= 4096
    # Full: a later batch is refused whole, the records kept are the oldest.
    assert spool.append([sample(100)]) == 1
    segments = []
    while (segment := spool.oldest()) is not None:
        segments.extend(spool.read(segment))
        spool.remove(segment)
    assert segments == [sample(i) for i in range(100 - refused)]


def test_files_roll_over_and_a_new_process_finds_them(tmp_path: Path) -> None:
    spool = UsageSpool(tmp_path, 16384)  # a file is closed past 4096 bytes
    spool.load()
    for start in range(0, 80, 5):
        spool.append([sample(i) for i in range(start, start + 5)])
    spool.close()
    assert len(list(tmp_path.glob("*.jsonl"))) > 1
    again = UsageSpool(tmp_path, 16384)
    again.load()
    assert (again.records, again.size) == (spool.records, spool.size)
    assert again.oldest_ts == T0
    again.append([sample(80)])
    read = []
    while (segment := again.oldest()) is not None:
        read.extend(again.read(segment))
        again.remove(segment)
    assert read == [sample(i) for i in range(81)]


def test_a_line_cut_short_is_left_out(tmp_path: Path) -> None:
    spool = UsageSpool(tmp_path, 1 << 20)
    spool.load()
    spool.append([sample(0), sample(1)])
    spool.close()
    (path,) = tmp_path.glob("*.jsonl")
    path.write_bytes(path.read_bytes() + b'[1800000002.0,"r-2","ac')
    again = UsageSpool(tmp_path, 1 << 20)
    again.load()
    segment = again.oldest()
    assert segment is not None
    assert again.read(segment) == [sample(0), sample(1)]


def test_one_directory_serves_one_spool_at_a_time(tmp_path: Path) -> None:
    first = UsageSpool(tmp_path, 1 << 20)
    first.load()
    with pytest.raises(SpoolInUse):
        UsageSpool(tmp_path, 1 << 20).load()
    first.close()
    UsageSpool(tmp_path, 1 << 20).load()


def test_a_count_past_64_bits_is_spooled_held_within(tmp_path: Path) -> None:
    spool = UsageSpool(tmp_path, 1 << 20)
    spool.load()
    assert spool.append([sample(0, prompt_tokens=2**70)]) == 0
    segment = spool.oldest()
    assert segment is not None
    assert spool.read(segment) == [sample(0, prompt_tokens=2**63 - 1)]
