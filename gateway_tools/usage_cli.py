"""`gateway usage report`: what each tenant, key and model used and cost, from the ledger.

    gateway usage report --config config/gateway.yaml --by tenant,key,model --since 24h
        [--until 2026-12-01T12:00] [--csv]

The ledger is the one `ledger.url` in the config names (the gateway writes it); `--since`
and `--until` are ISO 8601 times (UTC unless they say) or a duration back from now
(`90m`, `24h`, `7d`). Costs are in the price table's currency (`prices.currency`).

A window without usage prints the table's header and "no usage in this window" (with
`--csv`, the header line alone), and exits 0. The report only reads: a ledger that is not
there (an SQLite file that does not exist: it is created by the gateway, with its first
usage record) or a database that does not answer is one line on stderr and exit 1, and
nothing is created.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import time
from pathlib import Path

from gateway.ledger.errors import LedgerMissing, LedgerUnavailable
from gateway.ledger.ledger_store import open_store
from gateway.ledger.usage_report import (
    ReportQuery,
    ReportRow,
    parse_group_by,
    point_in_time,
    render_csv,
    report_columns,
)

_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)")
EMPTY = "no usage in this window"


def add_usage_arguments(parser: argparse.ArgumentParser) -> None:
    """The `usage` command's subcommands."""
    commands = parser.add_subparsers(dest="usage_command", required=True)
    report = commands.add_parser("report", help="usage and cost by tenant, key, model")
    report.add_argument("--config", required=True, help="gateway.yaml (its ledger and prices)")
    report.add_argument(
        "--by",
        default="tenant",
        help="groups: tenant, key, model (the model that served; refused requests have "
        "none), requested (the model asked), endpoint, batch (the batch a request was a "
        "line of; empty: a client's own)",
    )
    report.add_argument("--since", default="24h", help="ISO time or a duration back (24h)")
    report.add_argument("--until", default=None, help="ISO time or a duration back (now)")
    report.add_argument("--csv", action="store_true", help="CSV instead of a table")
    report.set_defaults(run=run_report)


def run_report(args: argparse.Namespace) -> int:
    """Print the report; 2 with a one-line reason for bad arguments or a config without a
    ledger, 1 with one for a ledger that is not there or cannot be read."""
    from gateway.config import ConfigError, load_config

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 2
    ledger = config.gateway.ledger
    if ledger is None:
        print(f"{args.config}: no `ledger:`: the gateway keeps no usage records", file=sys.stderr)
        return 2
    now = time.time()
    try:
        query = ReportQuery(
            point_in_time(args.since, now),
            now if args.until is None else point_in_time(args.until, now),
            parse_group_by(args.by),
        )
    except ValueError as exc:
        print(f"gateway usage report: {exc}", file=sys.stderr)
        return 2
    try:
        rows = asyncio.run(_query(ledger.url, query))
    except LedgerMissing as missing:
        print(
            f"gateway usage report: no usage ledger at {missing.path.absolute()} "
            f"({_pointed_by(args.config)}); the gateway creates it with its first usage record",
            file=sys.stderr,
        )
        return 1
    except LedgerUnavailable as unavailable:
        print(f"gateway usage report: {unavailable}", file=sys.stderr)
        return 1
    # Totals (no group) over no records are one row of zeros: no usage all the same.
    rows = [row for row in rows if row.get("requests")]
    columns = report_columns(query)
    currency = config.gateway.prices.currency
    if args.csv:
        sys.stdout.write(render_csv(rows, columns))
    else:
        print(_table(rows, columns, currency))
        if not rows:
            print(EMPTY)
    return 0


async def _query(url: str, query: ReportQuery) -> list[ReportRow]:
    store = open_store(url, read_only=True)
    try:
        return await store.query(query)
    finally:
        await store.close()


def _pointed_by(config_path: str) -> str:
    """What points at the ledger: `ledger.url`, its line in the config, and the
    environment variables that line reads (the demo's GATEWAY_STATE_DIR), set or not."""
    from gateway.config.source import read_source

    line = read_source(config_path).value_lines.get(("ledger", "url"))
    if line is None:
        return f"the default ledger.url, {config_path} sets none"
    try:
        text = Path(config_path).read_text(encoding="utf-8").splitlines()[line - 1]
    except (OSError, UnicodeDecodeError, IndexError):
        text = ""
    where = f"ledger.url, {config_path}:{line}"
    for name in dict.fromkeys(_ENV_REFERENCE.findall(text)):
        value = os.environ.get(name)
        where += f", {name} not set" if value is None else f", {name}={value or '(empty)'}"
    return where


def _cell(column: str, value: object) -> str:
    """One value as the table shows it: a cost in the currency, a latency in whole ms."""
    if value is None:
        return ""
    if column == "cost_micros":
        return f"{int(str(value)) / 1e6:.6f}"
    if isinstance(value, float):
        return f"{value:.0f}"  # latencies: the ledger keeps them to the microsecond
    return str(value)


def _table(rows: list[ReportRow], columns: list[str], currency: str) -> str:
    """An aligned text table, costs in the currency (not micro-units)."""
    shown = [c if c != "cost_micros" else f"cost_{currency}" for c in columns]
    cells = [[_cell(c, row.get(c)) for c in columns] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(shown)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(shown, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)
