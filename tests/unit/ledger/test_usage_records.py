from __future__ import annotations

import json
from dataclasses import replace

import pytest

from gateway.ledger.usage_records import COLUMNS, UsageRecord, clean_row, from_row
from tests.unit.ledger.usage_samples import MCP_OUTCOMES, mcp_call, sample


def test_a_row_holds_the_fields_in_column_order() -> None:
    record = sample(3)
    assert record.row() == tuple(getattr(record, name) for name in COLUMNS)


def test_a_row_makes_the_same_record_again() -> None:
    record = sample(5, fallback="llama-8b")
    assert from_row(list(record.row())) == record


def test_an_mcp_call_s_bytes_make_the_same_record_again_through_a_spool_line() -> None:
    record = sample(7, endpoint="mcp", bytes_in=312, bytes_out=2**40 + 5, outcome="ok")
    assert record.row()[-3:] == (312, 2**40 + 5, "ok")
    assert from_row(json.loads(json.dumps(record.row()))) == record


@pytest.mark.parametrize("outcome", [*MCP_OUTCOMES, "rate_requests", "queue_full", ""])
def test_an_outcome_makes_the_same_record_again_through_a_spool_line(outcome: str) -> None:
    record = mcp_call(7, outcome) if outcome in MCP_OUTCOMES else sample(7, outcome=outcome)
    line = json.dumps(record.row())
    assert json.loads(line)[-1] == outcome  # the last value of the line
    assert from_row(json.loads(line)) == record
    assert from_row(json.loads(line)).outcome == outcome


def _with(row: list[object], name: str, value: object) -> list[object]:
    """The row with the value of column `name` changed."""
    at = COLUMNS.index(name)
    return [*row[:at], value, *row[at + 1 :]]


@pytest.mark.parametrize(
    "change",
    [
        lambda row: row[:-6],  # cut short of every line ever written
        lambda row: row[:-2],  # the bytes sent and not the bytes got back (nor an outcome)
        lambda row: [*row[:-2], "ok"],  # an outcome where the bytes got back would be
        lambda row: [*row, 0],  # one value too many
        lambda row: _with(row, "ttft_ms", "12"),  # text for the time to first token
        lambda row: _with(row, "batch_id", 12),  # a number for the batch
        lambda row: _with(row, "bytes_in", "12"),  # text for the bytes sent
        lambda row: _with(row, "bytes_out", 1.5),  # a fraction of a byte
        lambda row: _with(row, "bytes_out", None),  # no bytes is 0, not null
        lambda row: _with(row, "bytes_in", False),  # a boolean is not a count of bytes
        lambda row: _with(row, "outcome", None),  # no outcome is "", not null
        lambda row: _with(row, "outcome", 0),  # a number for the outcome
        lambda row: _with(row, "outcome", ["ok"]),  # a list for the outcome
        lambda row: [*row[:2], 7, *row[3:]],  # a number for the tenant
        lambda row: [*row[:7], "100", *row[8:]],  # text for a count
        lambda row: [*row[:7], True, *row[8:]],  # a boolean is not a count
        lambda row: ["now", *row[1:]],  # text for the time
    ],
)
def test_a_malformed_row_is_refused(change: object) -> None:
    row = list(sample(1, outcome="ok").row())
    with pytest.raises(ValueError):
        from_row(change(row))  # type: ignore[operator]


def test_a_spool_line_from_before_the_time_to_first_token_reads_without_it() -> None:
    record = sample(4, outcome="tool_error")
    earlier = list(record.row())[: COLUMNS.index("ttft_ms")]
    assert from_row(earlier).ttft_ms is None
    assert from_row(earlier).cost_micros == record.cost_micros
    # ... nor a batch, nor bytes, nor an outcome: the line's other values as written.
    assert from_row(earlier) == replace(
        record, ttft_ms=None, batch_id="", bytes_in=0, bytes_out=0, outcome=""
    )


def test_a_spool_line_from_before_the_batch_id_reads_as_no_batch() -> None:
    record = sample(3, outcome="timeout")
    assert record.batch_id == "batch_1"
    earlier = from_row(list(record.row())[: COLUMNS.index("batch_id")])
    assert (earlier.batch_id, earlier.ttft_ms) == ("", record.ttft_ms)
    assert (earlier.bytes_in, earlier.bytes_out, earlier.outcome) == (0, 0, "")


def test_a_spool_line_from_before_the_bytes_reads_as_no_bytes() -> None:
    record = sample(3, bytes_in=120, bytes_out=4096, outcome="timeout")
    earlier = from_row(list(record.row())[: COLUMNS.index("bytes_in")])
    assert (earlier.bytes_in, earlier.bytes_out, earlier.outcome) == (0, 0, "")
    assert earlier == replace(record, bytes_in=0, bytes_out=0, outcome="")
    assert (earlier.batch_id, earlier.ttft_ms) == ("batch_1", record.ttft_ms)


def test_a_spool_line_from_before_the_outcome_reads_as_none_with_its_bytes() -> None:
    record = mcp_call(7, "timeout", bytes_in=120, bytes_out=4096)
    line = json.dumps(list(record.row())[: COLUMNS.index("outcome")])
    assert json.loads(line)[-2:] == [120, 4096]  # the line ends with the bytes
    earlier = from_row(json.loads(line))
    assert earlier.outcome == ""
    assert (earlier.bytes_in, earlier.bytes_out, earlier.status) == (120, 4096, 200)
    assert earlier == replace(record, outcome="")


def test_a_record_has_slots() -> None:
    assert not hasattr(sample(0), "__dict__")
    assert UsageRecord.__slots__


def test_a_clean_row_has_no_nul_and_counts_within_64_bits() -> None:
    record = sample(2, model_requested="a\x00b\x00", cost_micros=-(2**80), prompt_tokens=2**64)
    cleaned = from_row(clean_row(record.row()))
    assert cleaned.model_requested == "ab"
    assert (cleaned.cost_micros, cleaned.prompt_tokens) == (-(2**63), 2**63 - 1)
    assert clean_row(sample(3).row()) == sample(3).row()
    huge = from_row(clean_row(sample(4, bytes_in=2**64, bytes_out=-(2**70)).row()))
    assert (huge.bytes_in, huge.bytes_out) == (2**63 - 1, -(2**63))
