"""The MCP gateway (issue 45) as clients use it: the `mcp` SDK's client on `/mcp` of a
real gateway, with the tests' own servers behind it over stdio (in the sandbox) and over
Streamable HTTP; what each tenant sees and may call, its limits, its records."""

from __future__ import annotations

import asyncio
import sqlite3
import time
import urllib.request
from pathlib import Path
from typing import Any

import httpx2
import orjson
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.e2e.mcp.conftest import MCP_KEYS, TOKEN, mcp_session
from tests.e2e.stack import Gateway


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def text_of(result: Any) -> str:
    return "".join(part.text for part in result.content if part.type == "text")


def test_the_sdk_sees_every_server_s_tools_under_its_name_and_calls_them(
    mcp_gateway: Gateway,
) -> None:
    async def session() -> tuple[list[str], str, str, list[str], str, list[str], str]:
        async with mcp_session(mcp_gateway.url, MCP_KEYS["acme"]) as client:
            tools = [tool.name for tool in (await client.list_tools()).tools]
            added = text_of(await client.call_tool("notes__add", {"a": 2, "b": 3}))
            echoed = text_of(await client.call_tool("notes-http__echo", {"text": "over http"}))
            resources = [str(r.uri) for r in (await client.list_resources()).resources]
            read = await client.read_resource("notes+notes://today")
            prompts = [p.name for p in (await client.list_prompts()).prompts]
            greeting = await client.get_prompt("notes__greet", {"name": "Ann"})
            content = greeting.messages[0].content
            return (
                tools,
                added,
                echoed,
                resources,
                read.contents[0].text,  # type: ignore[union-attr]
                prompts,
                content.text,  # type: ignore[union-attr]
            )

    tools, added, echoed, resources, note, prompts, greeting = run(session())
    assert {"notes__echo", "notes__add", "notes-http__echo", "hostile__ok"} <= set(tools)
    assert added == "5"
    assert echoed == "over http"
    assert "notes+notes://today" in resources and "notes-http+notes://today" in resources
    assert note == "buy milk"
    assert "notes__greet" in prompts
    assert greeting == "Say hello to Ann."


def test_a_tenant_sees_and_calls_only_the_tools_it_is_given(mcp_gateway: Gateway) -> None:
    async def session() -> tuple[list[str], str, str]:
        async with mcp_session(mcp_gateway.url, MCP_KEYS["globex"]) as client:
            tools = [tool.name for tool in (await client.list_tools()).tools]
            allowed = text_of(await client.call_tool("notes__echo", {"text": "mine"}))
            with pytest.raises(MCPError) as refused:
                await client.call_tool("notes__add", {"a": 1, "b": 1})
            with pytest.raises(MCPError) as unknown:
                await client.call_tool("notes__no_such_tool", {})
            return tools, allowed, f"{refused.value.error.message}|{unknown.value.error.message}"

    tools, allowed, refusals = run(session())
    assert tools == ["notes__echo"]
    assert allowed == "mine"
    # Not allowed and not there read alike: the refusal tells nothing of what exists.
    assert refusals == "Unknown tool: notes__add|Unknown tool: notes__no_such_tool"


def test_a_stdio_server_runs_sandboxed_with_only_its_own_credentials(
    mcp_gateway: Gateway,
) -> None:
    host_file = str(Path(__file__).resolve())

    async def session() -> tuple[str, str, str, str]:
        async with mcp_session(mcp_gateway.url, MCP_KEYS["acme"]) as client:
            looked = text_of(
                await client.call_tool("notes__look", {"path": host_file, "port": 6379})
            )
            secret = text_of(await client.call_tool("notes__secret_env", {"name": "NOTES_TOKEN"}))
            others = text_of(await client.call_tool("notes__secret_env", {"name": "SELF_URL"}))
            shadow = text_of(await client.call_tool("notes__look", {"path": "/etc/shadow"}))
            return looked, secret, others, shadow

    looked, secret, others, shadow = run(session())
    assert "cannot read" in looked and "cannot reach 127.0.0.1:6379" in looked
    assert looked.endswith("uid 65534")
    assert secret == f"set, {len(TOKEN)} characters"
    assert others == "unset"  # nothing of the gateway's own environment
    assert "cannot read /etc/shadow" in shadow


def test_a_stdio_server_holds_no_descriptor_of_the_gateway_s(mcp_gateway: Gateway) -> None:
    async def session() -> str:
        async with mcp_session(mcp_gateway.url, MCP_KEYS["acme"]) as client:
            return text_of(await client.call_tool("notes__open_fds", {}))

    held = run(session()).split()
    # Its pipes and what its own runtime opens (its event loop's socket pair); never one
    # of the gateway's listening sockets: a server that held one could accept another
    # tenant's connection, key and all.
    listening = listening_sockets({mcp_gateway.url, mcp_gateway.ops_url})
    assert len(listening) == 2
    assert held and not [fd for fd in held if fd.split(":", 1)[1] in listening], held


def listening_sockets(urls: set[str]) -> set[str]:
    """`socket:[INODE]` of each socket listening on the ports of `urls` (from /proc)."""
    ports = {int(url.rsplit(":", 1)[1]) for url in urls}
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            port, state, inode = int(fields[1].rsplit(":", 1)[1], 16), fields[3], fields[9]
            if state == "0A" and port in ports:  # LISTEN
                found.add(f"socket:[{inode}]")
    return found


def test_a_tool_s_own_rate_refuses_with_429_and_retry_after(mcp_gateway: Gateway) -> None:
    async def session() -> tuple[list[str], str]:
        async with mcp_session(mcp_gateway.url, MCP_KEYS["limited"]) as client:
            results = []
            for _ in range(3):
                try:
                    results.append(text_of(await client.call_tool("notes__add", {"a": 1, "b": 2})))
                except MCPError as refused:
                    results.append(f"refused: {refused.error.message}")
            other = text_of(await client.call_tool("notes__echo", {"text": "still here"}))
            return results, other

    results, other = run(session())
    assert results[:2] == ["3", "3"]
    assert results[2].startswith("refused")
    assert other == "still here"  # the limit is the tool's, not the tenant's
    status, headers, body = post_raw(
        mcp_gateway.url,
        MCP_KEYS["limited"],
        {
            "jsonrpc": "2.0",
            "id": 7,
            "method": "tools/call",
            "params": {"name": "notes__add", "arguments": {"a": 1, "b": 1}},
        },
        session=new_session(mcp_gateway.url, MCP_KEYS["limited"]),
    )
    assert status == 429
    assert int(headers["retry-after"]) >= 1
    assert body["id"] == 7 and body["error"]["code"] == -32029


def new_session(url: str, key: str) -> str:
    status, headers, body = post_raw(
        url,
        key,
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "raw", "version": "1"},
            },
        },
    )
    assert status == 200, body
    return headers["mcp-session-id"]


def post_raw(
    url: str,
    key: str | None,
    message: Any,
    session: str | None = None,
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
) -> tuple[int, dict[str, str], Any]:
    """POST one message to /mcp as bytes; the status, headers and parsed body."""
    sent = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        **(headers or {}),
    }
    if key is not None:
        sent["Authorization"] = f"Bearer {key}"
    if session is not None:
        sent["Mcp-Session-Id"] = session
    request = urllib.request.Request(
        f"{url}/mcp", data=orjson.dumps(message) if body is None else body, headers=sent
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            raw, status, got = response.read(), response.status, response.headers
    except urllib.error.HTTPError as error:
        raw, status, got = error.read(), error.code, error.headers
    return status, {k.lower(): v for k, v in got.items()}, orjson.loads(raw) if raw else None


def test_every_call_is_a_record_in_the_usage_ledger(mcp_gateway: Gateway) -> None:
    arguments = {"text": "recorded " * 10}

    async def session() -> None:
        async with mcp_session(mcp_gateway.url, MCP_KEYS["globex"]) as client:
            await client.call_tool("notes__echo", arguments)
            with pytest.raises(MCPError):
                await client.call_tool("notes__add", {"a": 1, "b": 1})

    def rows() -> list[tuple[Any, ...]]:
        database = mcp_gateway.config_dir / "usage.db"
        if not database.exists():
            return []  # nothing recorded yet: the ledger makes its file on its first write
        with sqlite3.connect(database) as connection:
            found: list[tuple[Any, ...]] = connection.execute(
                "SELECT endpoint, key_id, model_requested, model_served, status, bytes_in,"
                " bytes_out, outcome FROM usage_ledger WHERE tenant = 'globex'"
                " AND model_requested IN ('notes__echo', 'notes__add') ORDER BY ts"
            ).fetchall()
        return found

    refused_before = sum(1 for row in rows() if row[2] == "notes__add")
    run(session())
    sent = len(orjson.dumps(arguments))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = rows()
        echoed = [row for row in found if row[2] == "notes__echo" and row[5] == sent]
        refused = [row for row in found if row[2] == "notes__add"]
        if echoed and len(refused) > refused_before:
            break
        time.sleep(0.2)
    assert echoed and echoed[-1][0] == "mcp" and echoed[-1][1]
    assert echoed[-1][3] == "notes" and echoed[-1][4] == 200
    assert echoed[-1][6] > len("recorded " * 10) and echoed[-1][7] == "ok"
    # Refused: recorded too, with nothing sent, and why.
    assert refused[-1][0] == "mcp" and refused[-1][5] == 0 and refused[-1][6] == 0
    assert refused[-1][7] == "refused"


AWS_KEY = "AKIAIOSFODNN7EXAMPLE"


def test_a_secret_in_the_arguments_of_an_external_server_s_tool_is_blocked(
    mcp_gateway: Gateway,
) -> None:
    async def session() -> tuple[int, str, str]:
        async with mcp_session(mcp_gateway.url, MCP_KEYS["acme"]) as client:
            with pytest.raises(MCPError) as blocked:
                await client.call_tool("notes-ext__echo", {"text": f"deploy with {AWS_KEY}"})
            error = blocked.value.error
            # Inside the cluster the same call goes as it is.
            inside = text_of(await client.call_tool("notes-http__echo", {"text": AWS_KEY}))
            return error.code, error.message, inside

    code, message, inside = run(session())
    assert code == -32004
    assert message.startswith("Blocked: data kept from notes-ext (") and AWS_KEY not in message
    assert inside == AWS_KEY
    audit = [line for line in mcp_gateway.log.splitlines() if "outbound data blocked" in line]
    assert audit and '"model":"mcp:notes-ext"' in audit[-1] and AWS_KEY not in audit[-1]


def test_mask_sends_placeholders_to_an_external_server(mcp_gateway: Gateway) -> None:
    async def session() -> str:
        async with mcp_session(mcp_gateway.url, MCP_KEYS["acme"]) as client:
            text = f"mail ann@example.com the key {AWS_KEY}"
            return text_of(await client.call_tool("notes-mask__echo", {"text": text}))

    echoed = run(session())
    assert "ann@example.com" not in echoed and AWS_KEY not in echoed
    assert echoed.startswith("mail ") and "[" in echoed


def test_a_client_of_the_stateless_2026_era_is_served_without_a_session(
    mcp_gateway: Gateway,
) -> None:
    async def session() -> tuple[str | None, list[str], str]:
        headers = {"Authorization": f"Bearer {MCP_KEYS['globex']}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=60) as http,
            Client(streamable_http_client(f"{mcp_gateway.url}/mcp", http_client=http)) as client,
        ):
            tools = [tool.name for tool in (await client.list_tools()).tools]
            echoed = text_of(await client.call_tool("notes__echo", {"text": "stateless"}))
            return client.protocol_version, tools, echoed

    version, tools, echoed = run(session())
    assert version == "2026-07-28"  # its `auto` mode found the era by `server/discover`
    assert tools == ["notes__echo"]  # the tenant's reach, as in the other era
    assert echoed == "stateless"
    # A header that says another method than the body is refused.
    status, _, body = post_raw(
        mcp_gateway.url,
        MCP_KEYS["globex"],
        {"jsonrpc": "2.0", "id": 9, "method": "tools/list", "params": {}},
        headers={"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call"},
    )
    assert status == 400 and body["error"]["code"] == -32020


def test_a_tenant_s_writable_directory_is_its_own(mcp_gateway: Gateway) -> None:
    async def session(key: str, *calls: tuple[str, dict[str, Any]]) -> list[str]:
        async with mcp_session(mcp_gateway.url, MCP_KEYS[key]) as client:
            return [text_of(await client.call_tool(name, args)) for name, args in calls]

    written = run(
        session("acme", ("notes__write_note", {"name": "plan", "text": "acme's secret plan"}))
    )
    assert written == ["kept"]
    # Another tenant's process of the same server sees its own directory only.
    assert run(session("limited", ("notes__read_note", {"name": "plan"}))) == ["no such note"]
    assert run(session("acme", ("notes__read_note", {"name": "plan"}))) == ["acme's secret plan"]
    assert (mcp_gateway.config_dir / "notes" / "acme" / "plan").read_text() == "acme's secret plan"
