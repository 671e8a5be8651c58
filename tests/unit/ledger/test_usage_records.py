from __future__ import annotations

import pytest

from gateway.ledger.usage_records import COLUMNS, UsageRecord, clean_row, from_row
from tests.unit.ledger.usage_samples import sample


def test_a_row_holds_the_fields_in_column_order() -> None:
    record = sample(3)
    assert record.row() == tuple(getattr(record, name) for name in COLUMNS)


def test_a_row_makes_the_same_record_again() -> None:
    record = sample(5, fallback="llama-8b")
    assert from_row(list(record.row())) == record


@pytest.mark.parametrize(
    "change",
    [
        lambda row: row[:-3],  # cut short
        lambda row: [*row[:-2], "12", ""],  # text for the time to first token
        lambda row: [*row[:-1], 12],  # a number for the batch
        lambda row: [*row[:2], 7, *row[3:]],  # a number for the tenant
        lambda row: [*row[:7], "100", *row[8:]],  # text for a count
        lambda row: [*row[:7], True, *row[8:]],  # a boolean is not a count
        lambda row: ["now", *row[1:]],  # text for the time
    ],
)
def test_a_malformed_row_is_refused(change: object) -> None:
    row = list(sample(1).row())
    with pytest.raises(ValueError):
        from_row(change(row))  # type: ignore[operator]


def test_a_spool_line_from_before_the_time_to_first_token_reads_without_it() -> None:
    record = sample(4)
    earlier = list(record.row())[:-2]
    assert from_row(earlier).ttft_ms is None
    assert from_row(earlier).cost_micros == record.cost_micros


def test_a_spool_line_from_before_the_batch_id_reads_as_no_batch() -> None:
    record = sample(3)
    assert record.batch_id == "batch_1"
    earlier = from_row(list(record.row())[:-1])
    assert (earlier.batch_id, earlier.ttft_ms) == ("", record.ttft_ms)


def test_a_record_has_slots() -> None:
    assert not hasattr(sample(0), "__dict__")
    assert UsageRecord.__slots__


def test_a_clean_row_has_no_nul_and_counts_within_64_bits() -> None:
    record = sample(2, model_requested="a\x00b\x00", cost_micros=-(2**80), prompt_tokens=2**64)
    cleaned = from_row(clean_row(record.row()))
    assert cleaned.model_requested == "ab"
    assert (cleaned.cost_micros, cleaned.prompt_tokens) == (-(2**63), 2**63 - 1)
    assert clean_row(sample(3).row()) == sample(3).row()
