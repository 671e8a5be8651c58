"""A managed key's own MCP tools (issue 45): made and changed through the admin API
(`/admin/keys`, `mcp_tools`), they narrow what the key sees and may call of `/mcp`
within its tenant's reach; null gives it the whole of its tenant's again."""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request
from typing import Any

import orjson
import pytest
from mcp.shared.exceptions import MCPError

from tests.e2e.mcp.conftest import MCP_KEYS, mcp_session
from tests.e2e.stack import Gateway

# The gateway polls the keys every 0.25 s; a change made on it is seen at once.
SEEN_WITHIN_S = 5.0


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def text_of(result: Any) -> str:
    return "".join(part.text for part in result.content if part.type == "text")


def admin(gateway: Gateway, method: str, path: str, body: Any) -> tuple[int, Any]:
    """One call of the admin API as the root tenant: (status, JSON answer)."""
    request = urllib.request.Request(
        f"{gateway.ops_url}{path}",
        data=orjson.dumps(body),
        method=method,
        headers={
            "Authorization": f"Bearer {MCP_KEYS['root']}",
            "Content-Type": "application/json",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, orjson.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, orjson.loads(error.read())


def tool_names(url: str, key: str) -> list[str]:
    async def listing() -> list[str]:
        async with mcp_session(url, key) as client:
            return sorted(tool.name for tool in (await client.list_tools()).tools)

    result: list[str] = run(listing())
    return result


def test_a_key_s_mcp_tools_narrow_its_tenant_s_until_cleared(mcp_gateway: Gateway) -> None:
    status, made = admin(
        mcp_gateway, "POST", "/admin/keys",
        {"tenant": "acme", "name": "notes-echo-only", "mcp_tools": ["notes/echo"]},
    )  # fmt: skip
    assert status == 201, made
    assert made["mcp_tools"] == ["notes/echo"]
    key = made["key"]

    async def narrowed() -> tuple[list[str], str, str]:
        async with mcp_session(mcp_gateway.url, key) as client:
            tools = [tool.name for tool in (await client.list_tools()).tools]
            echoed = text_of(await client.call_tool("notes__echo", {"text": "mine"}))
            with pytest.raises(MCPError) as refused:
                await client.call_tool("notes__add", {"a": 1, "b": 1})
            return tools, echoed, refused.value.error.message

    tools, echoed, refusal = run(narrowed())
    assert tools == ["notes__echo"]
    assert echoed == "mine"
    # Refused as a tool that is not there: the key learns nothing of its tenant's others.
    assert refusal == "Unknown tool: notes__add"

    status, changed = admin(mcp_gateway, "PATCH", f"/admin/keys/{made['id']}", {"mcp_tools": None})
    assert status == 200, changed
    assert changed["mcp_tools"] is None
    tenants = tool_names(mcp_gateway.url, MCP_KEYS["acme"])
    assert {"notes__echo", "notes__add", "notes-http__echo", "hostile__ok"} <= set(tenants)
    deadline = time.monotonic() + SEEN_WITHIN_S
    while (seen := tool_names(mcp_gateway.url, key)) != tenants:
        assert time.monotonic() < deadline, seen
        time.sleep(0.25)

    async def widened() -> str:
        async with mcp_session(mcp_gateway.url, key) as client:
            return text_of(await client.call_tool("notes__add", {"a": 2, "b": 3}))

    assert run(widened()) == "5"


def test_a_key_s_patterns_never_reach_past_its_tenant_s(mcp_gateway: Gateway) -> None:
    """globex reaches `notes/echo` alone: its key's `*` gives it nothing more; a key of
    acme with `notes-http` (a server: all its tools) sees that server's tools only."""
    status, made = admin(
        mcp_gateway, "POST", "/admin/keys",
        {"tenant": "globex", "name": "everything", "mcp_tools": ["*"]},
    )  # fmt: skip
    assert status == 201, made
    assert tool_names(mcp_gateway.url, made["key"]) == ["notes__echo"]

    status, made = admin(
        mcp_gateway, "POST", "/admin/keys",
        {"tenant": "acme", "name": "http-notes", "mcp_tools": ["notes-http"]},
    )  # fmt: skip
    assert status == 201, made
    tools = tool_names(mcp_gateway.url, made["key"])
    assert tools and all(name.startswith("notes-http__") for name in tools)
    assert "notes-http__echo" in tools


def test_a_bad_pattern_is_a_400_naming_mcp_tools(mcp_gateway: Gateway) -> None:
    for patterns in (["notes/echo/more"], "notes/echo", ["notes/"], ["x" * 201]):
        status, answer = admin(
            mcp_gateway, "POST", "/admin/keys",
            {"tenant": "acme", "name": "bad", "mcp_tools": patterns},
        )  # fmt: skip
        assert status == 400, (patterns, answer)
        assert answer["error"]["param"] == "mcp_tools", answer
