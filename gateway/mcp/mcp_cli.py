"""`gateway mcp`: the MCP tools held from clients, and an operator's acceptance of one,
through the admin API (`/admin/mcp/tools`) over HTTP.

    gateway mcp held [--json]
    gateway mcp accept SERVER TOOL       (or SERVER__TOOL, as clients name it)

`--url` and `--admin-key` as `gateway keys` takes them (the ops listener; an admin
tenant's key).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from gateway.apikeys.keys_cli import (
    DEFAULT_URL,
    admin_answer,
    admin_key_of,
    connection_arguments,
)


def add_mcp_arguments(parser: argparse.ArgumentParser) -> None:
    """The `mcp` command's subcommands."""
    connection_arguments(parser, DEFAULT_URL)
    commands = parser.add_subparsers(dest="mcp_command", required=True)
    held = commands.add_parser("held", help="tools held from clients, and why")
    held.add_argument("--json", action="store_true", help="JSON rather than a table")
    connection_arguments(held, argparse.SUPPRESS)
    accept = commands.add_parser(
        "accept", help="show a held tool again, as it is now: SERVER TOOL, or SERVER__TOOL"
    )
    accept.add_argument("server", help="the server, or the tool's public name server__tool")
    accept.add_argument("tool", nargs="?")
    connection_arguments(accept, argparse.SUPPRESS)
    parser.set_defaults(run=run_mcp_command)


def table(held: list[dict[str, Any]]) -> str:
    """Held tools as the terminal shows them: one per line, what it says below."""
    if not held:
        return "no tool is held"
    lines = []
    for tool in held:
        lines.append(f"{tool['server']}/{tool['tool']}: {tool['reason']}")
        description = " ".join(str(tool["description"]).split())
        lines.append(f"    {description[:300]}")
    return "\n".join(lines)


def run_mcp_command(args: argparse.Namespace) -> int:
    admin_key = admin_key_of(args)
    if not admin_key:
        return 2
    if args.mcp_command == "held":
        answer = admin_answer(args.url, admin_key, "GET", "/admin/mcp/tools")
        if answer is None:
            return 1
        print(json.dumps(answer, indent=2) if args.json else table(answer["held"]))
        return 0
    server, tool = args.server, args.tool
    if tool is None:
        server, found, tool = server.partition("__")
        if not found or not tool:
            print("gateway mcp accept: give SERVER TOOL, or the public name SERVER__TOOL")
            return 2
    body = {"server": server, "tool": tool}
    answer = admin_answer(args.url, admin_key, "POST", "/admin/mcp/tools/accept", body)
    if answer is None:
        return 1
    accepted = answer["accepted"]
    print(f"accepted {accepted['server']}/{accepted['tool']} ({accepted['fingerprint'][:12]})")
    return 0
