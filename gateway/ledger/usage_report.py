"""The usage report: requests, tokens, cost, errors and latency by tenant, key, model...

Both stores answer it with one SQL query of their own dialect, built here, so that the
two agree: the same groups, sums and percentiles (the nearest-rank percentile,
PostgreSQL's `percentile_disc`, which SQLite computes with window functions). The
percentiles sort each group's latencies within the range: cheap for a report, which is
never on the request path.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

TABLE = "usage_ledger"

# A report's group name and the column it groups by ("model" is the model that served).
# `model` is the model that served (refused requests: none); `requested`, the model asked.
GROUPS = {
    "tenant": "tenant",
    "key": "key_id",
    "model": "model_served",
    "requested": "model_requested",
    "endpoint": "endpoint",
    # The batch a request was a line of ("": a client's own request).
    "batch": "batch_id",
    # How an MCP tool call ended, or why a request was refused ("": served).
    "outcome": "outcome",
}
# What each report row sums, in its order, after the group columns.
MEASURES = (
    "requests",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "cost_micros",
    # What MCP tool calls sent their servers and got back (0 for every other request).
    "bytes_in",
    "bytes_out",
    "errors",
    "latency_p50_ms",
    "latency_p95_ms",
)
PERCENTILES = (0.5, 0.95)
# A request that ended with this status or above counts as an error; and an MCP tool
# call that failed (its HTTP status 200: a JSON-RPC error is an answer).
ERROR_STATUS = 400
FAILED_CALLS = "('refused', 'blocked', 'timeout', 'too_large', 'unavailable', 'error', 'malformed')"
_ERROR = f"(status >= {ERROR_STATUS} OR outcome IN {FAILED_CALLS})"

ReportRow = dict[str, object]


@dataclass(frozen=True, slots=True)
class ReportQuery:
    """Records with `since <= ts < until` (unix seconds), grouped by `group_by`.

    `group_by` names groups of `GROUPS`, in the order the rows are sorted by; empty, the
    report is one row of totals.
    """

    since: float
    until: float
    group_by: tuple[str, ...] = ()
    # Only the records of this tenant (a tenant's own admin asks, issue 40); None: all.
    tenant: str | None = None

    def __post_init__(self) -> None:
        unknown = [name for name in self.group_by if name not in GROUPS]
        if unknown:
            known = ", ".join(GROUPS)
            raise ValueError(f"cannot group usage by {', '.join(unknown)} (only by {known})")
        if len(set(self.group_by)) != len(self.group_by):
            raise ValueError("a usage report groups by each field once")


def parse_group_by(text: str) -> tuple[str, ...]:
    """`"tenant,key,model"` as the group names (the CLI's `--by`); raises `ValueError`."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    ReportQuery(0.0, 0.0, names)  # the names checked once, where they are read
    return names


def report_columns(query: ReportQuery) -> list[str]:
    """A report's columns: its groups, then `MEASURES`."""
    return [*query.group_by, *MEASURES]


def _groups(query: ReportQuery) -> list[str]:
    return [GROUPS[name] for name in query.group_by]


def postgres_sql(query: ReportQuery, table: str = TABLE) -> tuple[str, list[object]]:
    """The report as PostgreSQL (`ts` a timestamptz), and its arguments."""
    groups = _groups(query)
    selected = [
        f'{column} AS "{name}"' for name, column in zip(query.group_by, groups, strict=True)
    ]
    percentiles = [
        f"percentile_disc({q}) WITHIN GROUP (ORDER BY latency_ms) AS {name}"
        for q, name in zip(PERCENTILES, MEASURES[-2:], strict=True)
    ]
    sql = (
        f"SELECT {', '.join(selected) + ', ' if selected else ''}"
        "count(*) AS requests,"
        " coalesce(sum(prompt_tokens), 0)::bigint AS prompt_tokens,"
        " coalesce(sum(cached_tokens), 0)::bigint AS cached_tokens,"
        " coalesce(sum(completion_tokens), 0)::bigint AS completion_tokens,"
        " coalesce(sum(cost_micros), 0)::bigint AS cost_micros,"
        " coalesce(sum(bytes_in), 0)::bigint AS bytes_in,"
        " coalesce(sum(bytes_out), 0)::bigint AS bytes_out,"
        f" count(*) FILTER (WHERE {_ERROR}) AS errors, "
        + ", ".join(percentiles)
        + f" FROM {table} WHERE ts >= to_timestamp($1) AND ts < to_timestamp($2)"
        + ("" if query.tenant is None else " AND tenant = $3")
    )
    if groups:
        positions = ", ".join(str(i + 1) for i in range(len(groups)))
        sql += f" GROUP BY {positions} ORDER BY {positions}"
    return sql, [float(query.since), float(query.until), *_tenant(query)]


def _tenant(query: ReportQuery) -> list[object]:
    return [] if query.tenant is None else [query.tenant]


def sqlite_sql(query: ReportQuery, table: str = TABLE) -> tuple[str, list[object]]:
    """The report as SQLite (`ts` unix seconds), and its arguments.

    SQLite has no percentile function: each record's rank within its group (`rn` of `n`)
    picks the nearest-rank percentile, the least latency whose rank is at least q * n,
    which is what PostgreSQL's `percentile_disc(q)` answers.
    """
    groups = _groups(query)
    partition = f"PARTITION BY {', '.join(groups)} " if groups else ""
    selected = [
        f'{column} AS "{name}"' for name, column in zip(query.group_by, groups, strict=True)
    ]
    percentiles = [
        f"min(CASE WHEN rn >= {q} * n THEN latency_ms END) AS {name}"
        for q, name in zip(PERCENTILES, MEASURES[-2:], strict=True)
    ]
    sql = (
        "WITH ranked AS (SELECT *,"
        f" row_number() OVER ({partition}ORDER BY latency_ms) AS rn,"
        f" count(*) OVER ({partition.strip()}) AS n"
        f" FROM {table} WHERE ts >= ? AND ts < ?"
        f"{'' if query.tenant is None else ' AND tenant = ?'}) "
        f"SELECT {', '.join(selected) + ', ' if selected else ''}"
        "count(*) AS requests,"
        " coalesce(sum(prompt_tokens), 0) AS prompt_tokens,"
        " coalesce(sum(cached_tokens), 0) AS cached_tokens,"
        " coalesce(sum(completion_tokens), 0) AS completion_tokens,"
        " coalesce(sum(cost_micros), 0) AS cost_micros,"
        " coalesce(sum(bytes_in), 0) AS bytes_in,"
        " coalesce(sum(bytes_out), 0) AS bytes_out,"
        f" coalesce(sum({_ERROR}), 0) AS errors, " + ", ".join(percentiles) + " FROM ranked"
    )
    if groups:
        positions = ", ".join(str(i + 1) for i in range(len(groups)))
        sql += f" GROUP BY {positions} ORDER BY {positions}"
    return sql, [float(query.since), float(query.until), *_tenant(query)]


def as_rows(query: ReportQuery, rows: Iterable[Sequence[object]]) -> list[ReportRow]:
    """A database's result rows (in `report_columns` order) as dicts."""
    columns = report_columns(query)
    return [dict(zip(columns, row, strict=True)) for row in rows]


def render_csv(rows: Iterable[Mapping[str, object]], columns: Sequence[str]) -> str:
    """The report as CSV with a header line (`--csv`); a missing value is an empty cell."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow(["" if row.get(name) is None else row.get(name) for name in columns])
    return out.getvalue()


# A report's window: a duration back from now (`24h`, `90m`), or an ISO 8601 time.
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def point_in_time(text: str, now: float) -> float:
    """Unix seconds of an ISO 8601 time (UTC unless it says) or of a duration back from
    `now`; `ValueError` for anything else."""
    duration = _DURATION.fullmatch(text.strip())
    if duration is not None:
        return now - float(duration.group(1)) * _SECONDS[duration.group(2)]
    moment = datetime.fromisoformat(text.strip())
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()
