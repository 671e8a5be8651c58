"""`gateway batches`: every tenant's batches for operators, through the admin API
(`/admin/batches`) over HTTP.

    gateway batches list [--tenant acme] [--json]
    gateway batches get batch_0123...
    gateway batches cancel batch_0123...

`--url` and `--admin-key` as `gateway keys` takes them (the ops listener; an admin
tenant's key, or a tenant's own admin key for its tenant's batches).
"""

from __future__ import annotations

import argparse
import json
from typing import Any
from urllib.parse import quote

from gateway.apikeys.keys_cli import (
    DEFAULT_URL,
    admin_answer,
    admin_key_of,
    connection_arguments,
)


def add_batches_arguments(parser: argparse.ArgumentParser) -> None:
    """The `batches` command's subcommands."""
    connection_arguments(parser, DEFAULT_URL)
    commands = parser.add_subparsers(dest="batches_command", required=True)
    listing = commands.add_parser("list", help="batches, newest first, with their progress")
    listing.add_argument("--tenant")
    listing.add_argument("--limit", type=int, default=100)
    listing.add_argument("--json", action="store_true", help="JSON rather than a table")
    for name, text in (("get", "one batch"), ("cancel", "cancel a batch")):
        command = commands.add_parser(name, help=text)
        command.add_argument("id")
        connection_arguments(command, argparse.SUPPRESS)
    connection_arguments(listing, argparse.SUPPRESS)
    parser.set_defaults(run=run_batches_command)


def progress(batch: dict[str, Any]) -> str:
    """`done+failed/total (pct%)` of a batch's lines."""
    lines = batch["lines"]
    finished = lines["total"] - lines["left"]
    share = 100.0 * finished / lines["total"] if lines["total"] else 100.0
    return f"{finished}/{lines['total']} ({share:.0f}%)"


def table(batches: list[dict[str, Any]]) -> str:
    """Batches as the terminal shows them."""
    columns = ("id", "tenant", "api", "status", "progress", "done", "failed", "models")
    rows = [columns] + [_row(b) for b in batches]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    return "\n".join(
        "  ".join(text.ljust(width) for text, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def _row(batch: dict[str, Any]) -> tuple[str, ...]:
    lines = batch["lines"]
    return (
        batch["id"], batch["tenant"], batch["api"], batch["status"], progress(batch),
        str(lines["done"]), str(lines["failed"] + lines["cancelled"] + lines["expired"]),
        ",".join(batch["models"]) or "-",
    )  # fmt: skip


def run_batches_command(args: argparse.Namespace) -> int:
    admin_key = admin_key_of(args)
    if not admin_key:
        return 2
    command = args.batches_command
    if command == "list":
        query = f"?limit={args.limit}" + (f"&tenant={quote(args.tenant)}" if args.tenant else "")
        call: tuple[str, str] = ("GET", "/admin/batches" + query)
    elif command == "get":
        call = ("GET", f"/admin/batches/{quote(args.id)}")
    else:
        call = ("POST", f"/admin/batches/{quote(args.id)}/cancel")
    answer = admin_answer(args.url, admin_key, *call)
    if answer is None:
        return 1
    if command == "list" and not args.json:
        print(table(answer.get("data", [])))
    else:
        print(json.dumps(answer, indent=2, ensure_ascii=False))
    return 0
