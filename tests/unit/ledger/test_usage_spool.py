from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from gateway.ledger.usage_records import COLUMNS
from gateway.ledger.usage_spool import SpoolInUse, UsageSpool
from tests.unit.ledger.usage_samples import MCP_OUTCOMES, T0, mcp_call, sample


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


def test_each_outcome_comes_back_from_the_spool(tmp_path: Path) -> None:
    spool = UsageSpool(tmp_path, 1 << 20)
    spool.load()
    records = [mcp_call(i, outcome) for i, outcome in enumerate(MCP_OUTCOMES)]
    records += [sample(20, status=429, outcome="rate_requests"), sample(21)]
    assert spool.append(records) == 0
    spool.close()
    again = UsageSpool(tmp_path, 1 << 20)  # as a gateway restarted finds them
    again.load()
    segment = again.oldest()
    assert segment is not None
    read = again.read(segment)
    assert read == records
    assert [record.outcome for record in read] == [*MCP_OUTCOMES, "rate_requests", ""]


def test_lines_an_older_gateway_spooled_come_back_with_no_outcome(tmp_path: Path) -> None:
    # Spooled before the outcome (MCP calls with their bytes), and before the bytes.
    calls = [mcp_call(2, "timeout"), mcp_call(7, "ok")]
    before_bytes = sample(3, outcome="rate_requests")
    lines = [json.dumps(list(call.row())[: COLUMNS.index("outcome")]) for call in calls]
    lines.append(json.dumps(list(before_bytes.row())[: COLUMNS.index("bytes_in")]))
    (tmp_path / "usage-0000000004.jsonl").write_text("\n".join(lines) + "\n")
    spool = UsageSpool(tmp_path, 1 << 20)
    spool.load()
    assert spool.records == 3 and spool.oldest_ts == T0 + 2
    spool.append([mcp_call(12, "refused")])  # a new gateway's record, in a file after
    read = []
    while (segment := spool.oldest()) is not None:
        read.extend(spool.read(segment))
        spool.remove(segment)
    assert spool.unreadable == 0
    assert read == [
        *(replace(call, outcome="") for call in calls),
        replace(before_bytes, outcome=""),
        mcp_call(12, "refused"),
    ]
    assert [(r.bytes_in, r.bytes_out, r.outcome) for r in read] == [
        (46, 2017, ""),
        (61, 7017, ""),
        (0, 0, ""),
        (76, 12017, "refused"),
    ]
