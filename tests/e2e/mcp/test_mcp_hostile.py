"""The MCP gateway under attack: a hostile upstream server (over stdio and over HTTP) and
a hostile client. Whatever either does, every request ends in an answer that is not a
5xx, another tenant goes on being served, and no tenant reaches another's session."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import subprocess
import urllib.request
from typing import Any

import aiohttp
import orjson
import pytest
from mcp.shared.exceptions import MCPError

from gateway_tools.dev.processes import gateway_command
from tests.e2e.mcp.conftest import HOSTILE_TOKEN, MCP_KEYS, mcp_session
from tests.e2e.mcp.test_mcp_gateway import new_session, post_raw, run, text_of
from tests.e2e.stack import Gateway

TOO_LARGE, TIMEOUT, UPSTREAM = -32003, -32001, -32000
SERVERS = ["hostile", "hostile-http"]


async def call_failing(url: str, tool: str, arguments: dict[str, Any]) -> int:
    """The JSON-RPC error code of a call that must fail."""
    async with mcp_session(url, MCP_KEYS["acme"]) as client:
        with pytest.raises(MCPError) as failed:
            await client.call_tool(tool, arguments)
        return failed.value.error.code


async def call_ok(url: str, key: str, tool: str, arguments: dict[str, Any]) -> str:
    async with mcp_session(url, MCP_KEYS[key]) as client:
        return text_of(await client.call_tool(tool, arguments))


@pytest.mark.parametrize("server", SERVERS)
def test_a_100_mb_result_is_cut_at_the_cap_and_the_server_serves_on(
    mcp_gateway: Gateway, server: str
) -> None:
    code = run(call_failing(mcp_gateway.url, f"{server}__big", {"mb": 100}))
    assert code == TOO_LARGE
    assert run(call_ok(mcp_gateway.url, "acme", f"{server}__ok", {})) == "ok done"


@pytest.mark.parametrize("server", SERVERS)
def test_a_result_that_never_ends_is_cut(mcp_gateway: Gateway, server: str) -> None:
    code = run(call_failing(mcp_gateway.url, f"{server}__endless", {}))
    assert code in (TOO_LARGE, TIMEOUT)
    assert run(call_ok(mcp_gateway.url, "acme", f"{server}__ok", {})) == "ok done"


@pytest.mark.parametrize("server", SERVERS)
def test_a_server_that_hangs_is_timed_out(mcp_gateway: Gateway, server: str) -> None:
    assert run(call_failing(mcp_gateway.url, f"{server}__hang", {})) == TIMEOUT


@pytest.mark.parametrize("server", SERVERS)
def test_a_flood_of_notifications_cuts_the_server_off(mcp_gateway: Gateway, server: str) -> None:
    assert run(call_failing(mcp_gateway.url, f"{server}__flood", {})) in (UPSTREAM, TIMEOUT)
    assert run(call_ok(mcp_gateway.url, "acme", f"{server}__ok", {})) == "ok done"


@pytest.mark.parametrize("server", SERVERS)
def test_malformed_json_rpc_from_a_server_is_an_error(mcp_gateway: Gateway, server: str) -> None:
    assert run(call_failing(mcp_gateway.url, f"{server}__malformed", {})) in (UPSTREAM, TIMEOUT)


def test_another_tenant_is_served_while_a_server_hangs_and_floods(mcp_gateway: Gateway) -> None:
    async def together() -> list[Any]:
        return await asyncio.gather(
            call_failing(mcp_gateway.url, "hostile__hang", {}),
            call_failing(mcp_gateway.url, "hostile-http__flood", {}),
            call_ok(mcp_gateway.url, "globex", "notes__echo", {"text": "served"}),
            return_exceptions=True,
        )

    hung, flooded, served = run(together())
    assert served == "served"
    assert hung == TIMEOUT and flooded in (UPSTREAM, TIMEOUT)


def admin(gateway: Gateway, path: str, body: Any = None) -> Any:
    request = urllib.request.Request(
        f"{gateway.ops_url}{path}",
        data=None if body is None else orjson.dumps(body),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {MCP_KEYS['root']}"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return orjson.loads(response.read())


def gateway_cli(gateway: Gateway, *args: str) -> str:
    """`gateway mcp ...` against the gateway's ops listener, as an operator runs it."""
    command = gateway_command(
        "mcp", *args, "--url", gateway.ops_url, "--admin-key", MCP_KEYS["root"]
    )
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_poisoned_description_is_held_until_an_operator_accepts_it(
    mcp_gateway: Gateway,
) -> None:
    async def listed() -> list[str]:
        async with mcp_session(mcp_gateway.url, MCP_KEYS["acme"]) as client:
            return [tool.name for tool in (await client.list_tools()).tools]

    assert "hostile-http__poisoned" not in run(listed())
    held = {(t["server"], t["tool"]): t for t in admin(mcp_gateway, "/admin/mcp/tools")["held"]}
    assert "instructions" in held[("hostile-http", "poisoned")]["reason"]
    assert "<IMPORTANT>" in held[("hostile-http", "poisoned")]["description"]
    assert run(call_failing(mcp_gateway.url, "hostile-http__poisoned", {})) == -32602
    shown = gateway_cli(mcp_gateway, "held")
    assert "hostile-http/poisoned: its description reads as instructions" in shown
    accepted = gateway_cli(mcp_gateway, "accept", "hostile-http", "poisoned")
    assert accepted.startswith("accepted hostile-http/poisoned")
    assert "hostile-http__poisoned" in run(listed())
    # The stdio server's own is held still: a pin is per server.
    assert "hostile__poisoned" not in run(listed())


def test_a_rug_pull_hides_the_changed_tool_until_an_operator_accepts_it(
    mcp_gateway: Gateway,
) -> None:
    async def change() -> tuple[list[str], list[str]]:
        async with mcp_session(mcp_gateway.url, MCP_KEYS["acme"]) as client:
            before = [tool.name for tool in (await client.list_tools()).tools]
            await client.call_tool("hostile__change", {})
            for _ in range(50):  # the server's list_changed reaches the gateway
                after = [tool.name for tool in (await client.list_tools()).tools]
                if "hostile__changer" not in after:
                    break
                await asyncio.sleep(0.1)
            return before, after

    before, after = run(change())
    assert "hostile__changer" in before
    assert "hostile__changer" not in after
    held = {(t["server"], t["tool"]) for t in admin(mcp_gateway, "/admin/mcp/tools")["held"]}
    assert ("hostile", "changer") in held
    accepted = admin(
        mcp_gateway, "/admin/mcp/tools/accept", {"server": "hostile", "tool": "changer"}
    )
    assert accepted["accepted"]["tool"] == "changer"
    assert run(call_ok(mcp_gateway.url, "acme", "hostile__changer", {})) == "changer done"


# The hostile client.


def test_a_batch_of_json_rpc_requests_is_refused(mcp_gateway: Gateway) -> None:
    session = new_session(mcp_gateway.url, MCP_KEYS["acme"])
    message = [{"jsonrpc": "2.0", "id": i, "method": "ping"} for i in range(3)]
    status, _, body = post_raw(mcp_gateway.url, MCP_KEYS["acme"], message, session=session)
    assert status == 400 and body["error"]["code"] == -32600


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{not json", 400, -32700),
        (b"[" * 5000 + b"]" * 5000, 400, None),
        (b'{"jsonrpc": "2.0", "id": {"a": 1}, "method": "ping"}', 400, -32600),
        (b'{"jsonrpc": "2.0", "id": true, "method": "ping"}', 400, -32600),
        (b'{"jsonrpc": "2.0", "id": "' + b"i" * 300 + b'", "method": "ping"}', 400, -32600),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "' + b"m" * 10_000 + b'"}', 400, -32600),
        (b'{"jsonrpc": "1.0", "id": 1, "method": "ping"}', 400, -32600),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": [1]}', 400, -32602),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "no/such"}', 200, -32601),
    ],
)
def test_malformed_messages_get_a_json_rpc_error_not_a_5xx(
    mcp_gateway: Gateway, body: bytes, status: int, code: int | None
) -> None:
    session = new_session(mcp_gateway.url, MCP_KEYS["acme"])
    got, _, answer = post_raw(mcp_gateway.url, MCP_KEYS["acme"], None, session, body=body)
    assert got == status
    if code is not None:
        assert answer["error"]["code"] == code


def test_a_huge_argument_is_refused_before_it_is_read(mcp_gateway: Gateway) -> None:
    session = new_session(mcp_gateway.url, MCP_KEYS["acme"])
    message = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "notes__echo", "arguments": {"text": "x" * 2_000_000}},
    }
    # Sent as a client that reads the answer even when the gateway stops reading its
    # body (the refusal comes as soon as Content-Length is read).
    host, port = mcp_gateway.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    payload = orjson.dumps(message)
    headers = {
        "Authorization": f"Bearer {MCP_KEYS['acme']}",
        "Mcp-Session-Id": session,
        "Content-Type": "application/json",
        "Content-Length": str(len(payload)),
    }
    connection.putrequest("POST", "/mcp")
    for name, value in headers.items():
        connection.putheader(name, value)
    connection.endheaders()
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        connection.send(payload)
    response = connection.getresponse()
    assert response.status == 413
    assert orjson.loads(response.read())["error"]["code"] == -32600


def test_a_call_of_a_tool_with_a_name_or_arguments_of_the_worst_kind(mcp_gateway: Gateway) -> None:
    session = new_session(mcp_gateway.url, MCP_KEYS["acme"])
    for params, code in (
        ({"name": "x" * 50_000, "arguments": {}}, -32602),
        ({"name": "notes__echo", "arguments": [1, 2]}, -32602),
        ({"name": 5}, -32602),
        ({"name": "__", "arguments": {}}, -32602),
        ({"name": "../../etc__passwd", "arguments": {}}, -32602),
    ):
        message = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": params}
        status, _, body = post_raw(mcp_gateway.url, MCP_KEYS["acme"], message, session=session)
        assert status == 200 and body["error"]["code"] == code, params


def test_a_session_is_its_key_s_alone(mcp_gateway: Gateway) -> None:
    url = mcp_gateway.url
    mine = new_session(url, MCP_KEYS["acme"])
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    assert post_raw(url, MCP_KEYS["acme"], ping, session=mine)[0] == 200
    # Another tenant's key with it: as an unknown session.
    status, _, body = post_raw(url, MCP_KEYS["globex"], ping, session=mine)
    assert status == 404 and body["error"]["message"] == "Session not found"
    assert post_raw(url, MCP_KEYS["acme"], ping, session="f" * 32)[0] == 404
    assert post_raw(url, MCP_KEYS["acme"], ping, session="../../x")[0] == 404
    assert post_raw(url, MCP_KEYS["acme"], ping)[0] == 400  # none named
    # Ended: gone for good.
    request = urllib.request.Request(
        f"{url}/mcp",
        method="DELETE",
        headers={"Authorization": f"Bearer {MCP_KEYS['acme']}", "Mcp-Session-Id": mine},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
    assert post_raw(url, MCP_KEYS["acme"], ping, session=mine)[0] == 404


def test_an_id_used_twice_is_answered_twice(mcp_gateway: Gateway) -> None:
    session = new_session(mcp_gateway.url, MCP_KEYS["acme"])
    for text in ("first", "second"):
        message = {
            "jsonrpc": "2.0",
            "id": "same",
            "method": "tools/call",
            "params": {"name": "notes__echo", "arguments": {"text": text}},
        }
        status, _, body = post_raw(mcp_gateway.url, MCP_KEYS["acme"], message, session=session)
        assert status == 200 and body["id"] == "same"
        assert body["result"]["content"][0]["text"] == text


def test_no_key_is_401_with_bearer_and_no_oauth_metadata(mcp_gateway: Gateway) -> None:
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    for key in (None, "sk-wrong"):
        status, headers, body = post_raw(mcp_gateway.url, key, ping)
        assert status == 401
        assert headers["www-authenticate"] == "Bearer"
        assert body["error"]["code"] == -32600
    request = urllib.request.Request(f"{mcp_gateway.url}/.well-known/oauth-protected-resource")
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(request, timeout=10)
    assert missing.value.code == 404


def test_a_page_of_another_origin_is_refused(mcp_gateway: Gateway) -> None:
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    status, _, _ = post_raw(
        mcp_gateway.url, MCP_KEYS["acme"], ping, headers={"Origin": "https://evil.example"}
    )
    assert status == 403
    status, _, _ = post_raw(
        mcp_gateway.url, MCP_KEYS["acme"], ping, headers={"MCP-Protocol-Version": "1999-01-01"}
    )
    assert status == 400


def test_thousands_of_calls_at_once_get_answers_and_429s_never_a_5xx(
    mcp_gateway: Gateway,
) -> None:
    url = mcp_gateway.url
    session = new_session(url, MCP_KEYS["limited"])
    message = orjson.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "notes__add", "arguments": {"a": 1, "b": 1}},
        }
    )
    headers = {
        "Authorization": f"Bearer {MCP_KEYS['limited']}",
        "Mcp-Session-Id": session,
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
    }

    async def flood() -> tuple[list[int], str]:
        async with aiohttp.ClientSession(headers=headers) as http:

            async def one() -> int:
                async with http.post(f"{url}/mcp", data=message) as response:
                    await response.read()
                    return response.status

            statuses = await asyncio.gather(*(one() for _ in range(2000)))
            served = await call_ok(url, "globex", "notes__echo", {"text": "still served"})
            return list(statuses), served

    statuses, served = run(flood())
    assert set(statuses) <= {200, 429}
    assert statuses.count(200) <= 2  # its tool's rate: two a minute
    assert served == "still served"
    assert not [line for line in mcp_gateway.log.splitlines() if '"status":5' in line]


def test_a_server_that_stops_reading_its_input_times_calls_out_and_is_restarted(
    mcp_gateway: Gateway,
) -> None:
    async def stalled() -> list[Any]:
        async with mcp_session(mcp_gateway.url, MCP_KEYS["acme"]) as client:
            with pytest.raises(MCPError):
                await client.call_tool("hostile__stall", {})
            big = {"mb": 0, "pad": "x" * 600_000}  # more than a pipe holds, twice over
            return await asyncio.gather(
                *(client.call_tool("hostile__ok", big) for _ in range(3)),
                return_exceptions=True,
            )

    results = run(stalled())
    # Timed out, or cut off as soon as the first timeout saw its requests unread.
    codes = [r.error.code if isinstance(r, MCPError) else r for r in results]
    assert set(codes) <= {TIMEOUT, UPSTREAM}, results
    assert run(call_ok(mcp_gateway.url, "acme", "hostile__ok", {})) == "ok done"


def test_a_server_s_last_words_never_reach_a_client_or_the_log_with_its_credential(
    mcp_gateway: Gateway,
) -> None:
    code = run(call_failing(mcp_gateway.url, "hostile__crash", {}))
    assert code == UPSTREAM
    assert HOSTILE_TOKEN not in mcp_gateway.log
    assert "auth failed with [credential]" in mcp_gateway.log


def test_names_no_client_could_call_are_neither_listed_nor_kept(mcp_gateway: Gateway) -> None:
    async def listed() -> list[str]:
        async with mcp_session(mcp_gateway.url, MCP_KEYS["acme"]) as client:
            return [tool.name for tool in (await client.list_tools()).tools]

    tools = run(listed())
    assert "hostile__with space" not in tools and not [t for t in tools if "nnnn" in t]
    held = admin(mcp_gateway, "/admin/mcp/tools")["held"]
    assert not [t for t in held if t["tool"].startswith("nnnn") or " " in t["tool"]]


def test_a_resource_of_a_server_out_of_reach_reads_as_one_not_there(
    mcp_gateway: Gateway,
) -> None:
    session = new_session(mcp_gateway.url, MCP_KEYS["globex"])  # its reach: notes/echo
    codes = []
    for uri in ("hostile+notes://today", "nosuch+notes://today"):
        message = {"jsonrpc": "2.0", "id": 1, "method": "resources/read", "params": {"uri": uri}}
        status, _, body = post_raw(mcp_gateway.url, MCP_KEYS["globex"], message, session=session)
        codes.append((status, body["error"]["code"], body["error"]["message"]))
    assert codes[0] == codes[1] == (200, -32002, "Resource not found")


def test_a_stateless_request_without_its_method_header_is_refused(mcp_gateway: Gateway) -> None:
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    status, _, body = post_raw(
        mcp_gateway.url, MCP_KEYS["acme"], message, headers={"MCP-Protocol-Version": "2026-07-28"}
    )
    assert status == 400 and body["error"]["code"] == -32020
