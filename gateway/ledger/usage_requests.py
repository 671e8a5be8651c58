"""One key's requests, each as the ledger recorded it: what `gateway eval` reads back to
attribute a tool's every model call (`GET /admin/usage/requests`).

Both stores answer it with one indexed query (`key_id, ts`), oldest first, at most
`limit` records: a caller pages on with the last record's `ts`.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.ledger.usage_records import COLUMNS
from gateway.ledger.usage_report import TABLE

# The most records one answer holds.
MAX_LIMIT = 10_000


@dataclass(frozen=True, slots=True)
class RequestsQuery:
    """The records of `key_id` with `since <= ts < until` (unix seconds), oldest first."""

    key_id: str
    since: float
    until: float
    limit: int = 1000
    # Only the records of this tenant (a tenant's own admin asks, issue 40); None: any.
    tenant: str | None = None

    def __post_init__(self) -> None:
        if not self.key_id:
            raise ValueError("name the key whose requests to list")
        if not 1 <= self.limit <= MAX_LIMIT:
            raise ValueError(f"limit must be 1 to {MAX_LIMIT}")


def sqlite_sql(query: RequestsQuery, table: str = TABLE) -> tuple[str, list[object]]:
    """The query as SQLite (`ts` unix seconds), and its arguments."""
    of_tenant = "" if query.tenant is None else " AND tenant = ?"
    sql = (
        f"SELECT {', '.join(COLUMNS)} FROM {table} WHERE key_id = ? AND ts >= ? AND ts < ?"
        f"{of_tenant} ORDER BY ts, request_id LIMIT ?"
    )
    tenant = [] if query.tenant is None else [query.tenant]
    return sql, [query.key_id, query.since, query.until, *tenant, query.limit]


def postgres_sql(query: RequestsQuery, table: str = TABLE) -> tuple[str, list[object]]:
    """The query as PostgreSQL (`ts` a timestamptz, read back as unix seconds)."""
    selected = ", ".join(
        "extract(epoch from ts)::double precision" if name == "ts" else name for name in COLUMNS
    )
    of_tenant = "" if query.tenant is None else " AND tenant = $5"
    sql = (
        f"SELECT {selected} FROM {table} WHERE key_id = $1 AND ts >= to_timestamp($2)"
        f" AND ts < to_timestamp($3){of_tenant} ORDER BY ts, request_id LIMIT $4"
    )
    tenant = [] if query.tenant is None else [query.tenant]
    return sql, [query.key_id, query.since, query.until, query.limit, *tenant]
