from __future__ import annotations

import csv
import io

import pytest

from gateway.ledger.usage_report import (
    MEASURES,
    ReportQuery,
    parse_group_by,
    postgres_sql,
    render_csv,
    report_columns,
    sqlite_sql,
)


def test_group_names_are_read_from_the_cli_form() -> None:
    assert parse_group_by("tenant, key,model") == ("tenant", "key", "model")
    assert parse_group_by("") == ()
    assert parse_group_by("endpoint,outcome") == ("endpoint", "outcome")


@pytest.mark.parametrize("text", ["tenant,region", "tenant,tenant", "status"])
def test_unknown_or_repeated_groups_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_group_by(text)


def test_the_columns_are_the_groups_then_the_measures() -> None:
    query = ReportQuery(0, 10, ("model", "tenant"))
    assert report_columns(query) == ["model", "tenant", *MEASURES]


@pytest.mark.parametrize("build", [postgres_sql, sqlite_sql])
def test_the_sql_groups_by_the_columns_asked_for(build: object) -> None:
    sql, args = build(ReportQuery(5, 10, ("tenant", "key", "model")))  # type: ignore[operator]
    assert args == [5, 10]
    assert 'key_id AS "key"' in sql
    assert 'model_served AS "model"' in sql
    assert sql.endswith("GROUP BY 1, 2, 3 ORDER BY 1, 2, 3")


@pytest.mark.parametrize("build", [postgres_sql, sqlite_sql])
def test_the_sql_groups_by_the_outcome(build: object) -> None:
    sql, _ = build(ReportQuery(5, 10, ("endpoint", "outcome")))  # type: ignore[operator]
    assert 'outcome AS "outcome"' in sql
    assert sql.endswith("GROUP BY 1, 2 ORDER BY 1, 2")


@pytest.mark.parametrize("build", [postgres_sql, sqlite_sql])
def test_totals_have_no_group_by(build: object) -> None:
    sql, _ = build(ReportQuery(5, 10))  # type: ignore[operator]
    assert "GROUP BY" not in sql


def test_csv_has_a_header_and_empty_cells_for_missing_values() -> None:
    rows = [
        {"tenant": "acme", "requests": 3, "latency_p50_ms": 1.5},
        {"tenant": "a,b", "requests": 0, "latency_p50_ms": None},
    ]
    text = render_csv(rows, ["tenant", "requests", "latency_p50_ms"])
    assert list(csv.reader(io.StringIO(text))) == [
        ["tenant", "requests", "latency_p50_ms"],
        ["acme", "3", "1.5"],
        ["a,b", "0", ""],
    ]
