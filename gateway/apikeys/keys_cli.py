"""`gateway keys`: managed API keys, through the admin API (`/admin/keys`) over HTTP.

    gateway keys create --tenant acme --name ci --models llm-small --budget 0.05/day \\
        --expires 2027-01-01 [--rpm 60] [--tpm 100000] [--admin-of acme] \\
        [--mcp-tools notes/echo,github/*]
    gateway keys list [--tenant acme] [--json]
    gateway keys get key_0123456789abcdef
    gateway keys update key_... [--name N] [--models a,b | --all-models]
        [--budget 1/month | --no-budget] [--expires T | --no-expiry] [--rpm N] [--tpm N]
        [--admin-of acme | --no-admin] [--mcp-tools notes/echo,github/* | --all-mcp-tools]
    gateway keys revoke key_...
    gateway keys rotate key_...

`--url` is the ops listener (default http://127.0.0.1:8081), `--admin-key` an admin
tenant's key, or a tenant's own admin key for that tenant's keys (default:
`$GATEWAY_ADMIN_KEY`). `--admin-of TENANT` (the key's own tenant; a global admin's to
give) makes the key that tenant's admin. `--mcp-tools` narrows the MCP tools the key
reaches of its tenant's (`server/tool`, `server/*`, `server`, `*`; `''`: none). A
create or a rotate prints the key, this once: it is kept nowhere.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote

ADMIN_KEY_ENV = "GATEWAY_ADMIN_KEY"
DEFAULT_URL = "http://127.0.0.1:8081"
URL_ENV = "GATEWAY_ADMIN_URL"
TIMEOUT_S = 10.0


def parse_budget(text: str) -> dict[str, Any]:
    """`0.05/day`, `10/month/llm-small`, `3` (a month) as the API's budget object."""
    amount, _, rest = text.partition("/")
    period, _, model = rest.partition("/")
    try:
        value = float(amount)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"budget {text!r}: AMOUNT[/day|month|total[/MODEL]]"
        ) from None
    budget: dict[str, Any] = {"amount": value, "period": period or "month"}
    if model:
        budget["model"] = model
    return budget


def _models(text: str) -> list[str]:
    return [m.strip() for m in text.split(",") if m.strip()]


def _mcp_tools(text: str) -> list[str]:
    """`notes/echo,github/*` as a list of patterns (`''`: none, an empty list)."""
    return [p.strip() for p in text.split(",") if p.strip()]


def add_keys_arguments(parser: argparse.ArgumentParser) -> None:
    """The `keys` command's subcommands. `--url` and `--admin-key` go before or after
    the subcommand."""
    connection_arguments(parser, DEFAULT_URL)
    commands = parser.add_subparsers(dest="keys_command", required=True)
    # After the subcommand too (`gateway keys create ... --url URL`): there they default
    # to nothing given, so that one given before stays.
    original = commands.add_parser

    def add_parser(name: str, **kwargs: Any) -> argparse.ArgumentParser:
        command = original(name, **kwargs)
        connection_arguments(command, argparse.SUPPRESS)
        return command

    commands.add_parser = add_parser  # type: ignore[method-assign]

    create = commands.add_parser("create", help="a new key (printed once)")
    create.add_argument("--tenant", required=True)
    create.add_argument("--name", required=True)
    _field_arguments(create)

    listing = commands.add_parser("list", help="every key (of one tenant)")
    listing.add_argument("--tenant")
    listing.add_argument("--json", action="store_true", help="JSON rather than a table")

    for name, text in (("get", "one key"), ("revoke", "revoke a key (every gateway, within 1 s)"),
                       ("rotate", "a new secret for a key (printed once)")):  # fmt: skip
        command = commands.add_parser(name, help=text)
        command.add_argument("id")

    update = commands.add_parser("update", help="change a key's name, models, expiry, budget")
    update.add_argument("id")
    update.add_argument("--name")
    _field_arguments(update)
    update.add_argument("--all-models", action="store_true", help="all of the tenant's")
    update.add_argument(
        "--all-mcp-tools", action="store_true", help="all of the tenant's MCP tools"
    )
    update.add_argument("--no-budget", action="store_true")
    update.add_argument("--no-expiry", action="store_true")
    update.add_argument("--no-admin", action="store_true", help="no longer its tenant's admin")
    parser.set_defaults(run=run_keys_command)


def connection_arguments(parser: argparse.ArgumentParser, url_default: str) -> None:
    parser.add_argument(
        "--url",
        default=os.environ.get(URL_ENV, url_default) if url_default != argparse.SUPPRESS
        else argparse.SUPPRESS,
        help=f"the gateway's ops listener (default: ${URL_ENV}, else {DEFAULT_URL})",
    )  # fmt: skip
    parser.add_argument(
        "--admin-key",
        default=None if url_default != argparse.SUPPRESS else argparse.SUPPRESS,
        help=f"an admin's key: an admin tenant's, or a tenant admin's (--admin-of) for its own "
        f"tenant (default: ${ADMIN_KEY_ENV})",
    )


def _field_arguments(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--models", type=_models, help="comma-separated (create: default all; update: unchanged)"
    )
    command.add_argument(
        "--budget", type=parse_budget, help="AMOUNT[/day|month|total[/MODEL]] (default: a month)"
    )
    command.add_argument("--expires", help="ISO 8601 time or date (UTC unless it says)")
    command.add_argument(
        "--rpm", type=int, help="the key's own requests per minute (its tenant's still apply)"
    )
    command.add_argument(
        "--tpm", type=int, help="the key's own tokens per minute (its tenant's still apply)"
    )
    command.add_argument(
        "--admin-of",
        metavar="TENANT",
        help="make the key its tenant's admin: it manages that tenant's keys and reads its "
        "usage (the key's own tenant; only a global admin may set it)",
    )
    command.add_argument(
        "--mcp-tools",
        type=_mcp_tools,
        metavar="PATTERNS",
        help="comma-separated MCP tools patterns (server/tool, server/*, server, *; '': "
        "none) narrowing the tenant's (create: default all of them; update: unchanged)",
    )


def _fields(args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if args.models is not None:
        body["models"] = args.models
    if getattr(args, "all_models", False):
        body["models"] = None
    if args.budget is not None:
        body["budget"] = args.budget
    if getattr(args, "no_budget", False):
        body["budget"] = None
    if args.expires is not None:
        body["expires_at"] = args.expires
    if getattr(args, "no_expiry", False):
        body["expires_at"] = None
    limits = {
        name: value
        for name, value in (("requests_per_minute", args.rpm), ("tokens_per_minute", args.tpm))
        if value is not None
    }
    if limits:
        body["limits"] = limits  # an update changes these and keeps the other
    if args.admin_of is not None:
        body["admin_of"] = args.admin_of
    if getattr(args, "no_admin", False):
        body["admin_of"] = None
    if args.mcp_tools is not None:
        body["mcp_tools"] = args.mcp_tools
    if getattr(args, "all_mcp_tools", False):
        body["mcp_tools"] = None
    return body


def request(
    url: str, admin_key: str, method: str, path: str, body: dict[str, Any] | None = None
) -> tuple[int, dict[str, Any]]:
    """(status, JSON answer) of one admin API call."""
    data = None if body is None else json.dumps(body).encode()
    call = urllib.request.Request(url.rstrip("/") + path, data=data, method=method)
    call.add_header("authorization", f"Bearer {admin_key}")
    if data is not None:
        call.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(call, timeout=TIMEOUT_S) as answer:
            return answer.status, json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as error:
        try:
            return error.code, json.loads(error.read() or b"{}")
        except ValueError:
            return error.code, {"error": {"message": error.reason}}


def _table(keys: list[dict[str, Any]]) -> str:
    columns = (
        *("id", "tenant", "name", "display", "status", "models", "budget", "expires_at"),
        *("admin_of", "mcp_tools"),
    )

    def cell(key: dict[str, Any], column: str) -> str:
        value = key.get(column)
        if column in ("models", "mcp_tools"):
            return "*" if value is None else ",".join(value) or "-"
        if column == "budget":
            return (
                "-"
                if value is None
                else f"{value['amount']:g}/{value['period']}"
                + (f"/{value['model']}" if value.get("model") else "")
            )
        return "-" if value is None else str(value)

    rows = [columns] + [tuple(cell(k, c) for c in columns) for k in keys]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    return "\n".join(
        "  ".join(text.ljust(width) for text, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def admin_key_of(args: argparse.Namespace) -> str | None:
    """`--admin-key`, else `$GATEWAY_ADMIN_KEY`; None (and said so) when neither is set."""
    admin_key: str | None = args.admin_key or os.environ.get(ADMIN_KEY_ENV)
    if not admin_key:
        print(f"an admin key is needed: --admin-key or ${ADMIN_KEY_ENV}", file=sys.stderr)
    return admin_key


def admin_answer(
    url: str, admin_key: str, method: str, path: str, body: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """The admin API's JSON answer; None (and the reason on stderr) when the gateway
    cannot be reached or refuses."""
    try:
        status, answer = request(url, admin_key, method, path, body)
    except (urllib.error.URLError, OSError) as exc:
        print(f"cannot reach the gateway at {url}: {exc}", file=sys.stderr)
        return None
    if status >= 400:
        error = answer.get("error", {})
        print(f"HTTP {status}: {error.get('message', answer)}", file=sys.stderr)
        return None
    return answer


def run_keys_command(args: argparse.Namespace) -> int:
    admin_key = admin_key_of(args)
    if not admin_key:
        return 2
    command = args.keys_command
    call: tuple[str, str, dict[str, Any] | None]
    if command == "create":
        body = {"tenant": args.tenant, "name": args.name, **_fields(args)}
        call = ("POST", "/admin/keys", body)
    elif command == "list":
        query = f"?tenant={quote(args.tenant)}" if args.tenant else ""
        call = ("GET", "/admin/keys" + query, None)
    elif command == "update":
        body = _fields(args)
        if args.name is not None:
            body["name"] = args.name
        call = ("PATCH", f"/admin/keys/{quote(args.id)}", body)
    else:
        path = f"/admin/keys/{quote(args.id)}"
        method = {"get": "GET", "revoke": "DELETE", "rotate": "POST"}[command]
        call = (method, path + ("/rotate" if command == "rotate" else ""), None)
    answer = admin_answer(args.url, admin_key, *call)
    if answer is None:
        return 1
    if command == "list" and not args.json:
        print(_table(answer.get("data", [])))
    else:
        print(json.dumps(answer, indent=2, ensure_ascii=False))
    if "key" in answer:
        print("the key is shown this once: keep it now", file=sys.stderr)
    return 0
