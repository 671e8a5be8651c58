"""MCP sessions across gateways: a session begun on one gateway is served by another on
the same Redis, and by a restarted one; its stream of list changes resumes from the
client's `Last-Event-ID` on any of them."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import aiohttp
import orjson
import pytest

from gateway_tools.dev.processes import stop
from gateway_tools.dev.sim.server import TritonSim
from tests.e2e.mcp.conftest import MCP_KEYS, start_mcp_gateway
from tests.e2e.mcp.test_mcp_gateway import new_session, post_raw
from tests.e2e.stack import Gateway

PREFIX = "gw-mcp-sessions"


@pytest.fixture(scope="module")
def two_gateways(
    sims: tuple[TritonSim, TritonSim],
    http_servers: dict[str, str],
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[list[Gateway]]:
    gateways = [
        start_mcp_gateway(tmp_path_factory.mktemp(name), sims, http_servers, redis_url, PREFIX)
        for name in ("mcp-a", "mcp-b")
    ]
    try:
        yield gateways
    finally:
        for gateway in gateways:
            stop(gateway.process)


def echo(url: str, session: str, text: str, key: str = "acme") -> tuple[int, str]:
    message = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "notes__echo", "arguments": {"text": text}},
    }
    status, _, body = post_raw(url, MCP_KEYS[key], message, session=session)
    return status, body["result"]["content"][0]["text"] if status == 200 else str(body)


def test_a_session_begun_on_one_gateway_is_served_by_another(
    two_gateways: list[Gateway],
) -> None:
    a, b = two_gateways
    session = new_session(a.url, MCP_KEYS["acme"])
    assert echo(b.url, session, "on b") == (200, "on b")
    assert echo(a.url, session, "on a") == (200, "on a")
    # Another tenant's key finds no session there, on either.
    status, _ = echo(b.url, session, "not mine", key="globex")
    assert status == 404


def test_a_restarted_gateway_serves_the_sessions_it_had(
    two_gateways: list[Gateway],
    sims: tuple[TritonSim, TritonSim],
    http_servers: dict[str, str],
    redis_url: str,
) -> None:
    a = two_gateways[0]
    session = new_session(a.url, MCP_KEYS["acme"])
    assert echo(a.url, session, "before")[0] == 200
    stop(a.process)
    restarted = start_mcp_gateway(a.config_dir, sims, http_servers, redis_url, PREFIX)
    two_gateways[0] = restarted
    assert echo(restarted.url, session, "after") == (200, "after")


async def next_event(
    http: aiohttp.ClientSession, url: str, session: str, last_event_id: str | None
) -> tuple[str, dict[str, object]]:
    """The first event of the session's stream on `url` (from `last_event_id`, if given)."""
    headers = {
        "Authorization": f"Bearer {MCP_KEYS['acme']}",
        "Mcp-Session-Id": session,
        "Accept": "text/event-stream",
    }
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    async with http.get(f"{url}/mcp", headers=headers) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        event_id = ""
        async for raw in response.content:
            line = raw.decode().rstrip("\n")
            if line.startswith("id: "):
                event_id = line[4:]
            elif line.startswith("data: "):
                return event_id, orjson.loads(line[6:])
    raise AssertionError("the stream ended without an event")


def test_the_stream_of_list_changes_resumes_from_the_last_event_on_any_gateway(
    two_gateways: list[Gateway],
) -> None:
    a, b = two_gateways
    session = new_session(a.url, MCP_KEYS["acme"])
    change = {
        "jsonrpc": "2.0",
        "id": 3,
        "method": "tools/call",
        "params": {"name": "hostile__change", "arguments": {}},
    }
    # The server's tools are known before the change (its process started).
    ping = {"jsonrpc": "2.0", "id": 4, "method": "tools/list"}
    assert post_raw(a.url, MCP_KEYS["acme"], ping, session=session)[0] == 200

    async def watch() -> tuple[str, dict[str, object], str, dict[str, object]]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            listening = asyncio.create_task(next_event(http, b.url, session, None))
            await asyncio.sleep(1.0)  # the stream is open on b before the change on a
            status, _, _ = await asyncio.to_thread(
                post_raw, a.url, MCP_KEYS["acme"], change, session
            )
            assert status == 200
            first_id, first = await listening
            # Back with an id from before it, on the other gateway: the same event again.
            earlier = str(int(first_id.split("-")[0]) - 1) + "-0"
            again_id, again = await next_event(http, a.url, session, earlier)
            return first_id, first, again_id, again

    first_id, first, again_id, again = asyncio.run(watch())
    assert first == {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
    assert again_id == first_id and again == first
