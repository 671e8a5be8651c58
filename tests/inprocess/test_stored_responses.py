"""Stored Responses API answers through the gateway (issue 40): each tenant's under its
quota (`stored_responses` in tenants.yaml), refused with a 429 naming the quota before
any inference, room given back by a delete; what is stored holds only the tools' known
fields; the quota and what is held visible in /metrics."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.inference.types import Completion, Usage
from gateway.observability import metrics
from tests.inprocess.conftest import InProcessGateway, started_gateway

JUNK = "x" * 500_000


def quota(**settings: int) -> Callable[[dict[str, Any]], None]:
    def edit(tenants: dict[str, Any]) -> None:
        tenants["tenants"]["acme"]["stored_responses"] = settings

    return edit


@pytest.fixture
async def small(
    config_for: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[InProcessGateway]:
    """acme may keep 2 stored responses."""
    path = config_for(edit_tenants=quota(max_count=2))
    async with started_gateway(path, monkeypatch) as started:
        yield started


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "llm-large", "input": "hi", **fields}


async def test_past_the_count_quota_a_request_to_store_is_a_429_before_inference(
    small: InProcessGateway,
) -> None:
    small.upstream.script("llm-large", Completion("ok", usage=Usage(1, 1)))
    async with small.http() as client:
        ids = []
        for _ in range(2):
            answer = await client.post("/v1/responses", json=body())
            assert answer.status_code == 200
            ids.append(answer.json()["id"])
        calls = len(small.upstream.calls)
        refused = await client.post("/v1/responses", json=body())
        assert refused.status_code == 429
        error = refused.json()["error"]
        assert error["code"] == "stored_responses_quota_exceeded"
        assert error["type"] == "insufficient_quota"
        assert error["param"] == "store"
        assert "2 of 2 responses" in error["message"]
        assert "stored_responses.max_count" in error["message"]
        assert refused.headers["x-should-retry"] == "false"
        assert len(small.upstream.calls) == calls  # refused before any inference
        # A stream is refused as plainly, before its first event.
        streamed = await client.post("/v1/responses", json=body(stream=True))
        assert streamed.status_code == 429
        # Not storing is still served, and reading what is stored.
        assert (await client.post("/v1/responses", json=body(store=False))).status_code == 200
        assert (await client.get(f"/v1/responses/{ids[0]}")).status_code == 200
        # A delete gives the room back.
        assert (await client.delete(f"/v1/responses/{ids[0]}")).status_code == 200
        assert (await client.post("/v1/responses", json=body())).status_code == 200
        # Another tenant's quota is its own.
    async with small.http(key="sk-test-globex") as other:
        small.upstream.script("llm-small", Completion("ok", usage=Usage(1, 1)))
        answer = await other.post("/v1/responses", json={**body(), "model": "llm-small"})
        assert answer.status_code == 200
    refusals = metrics.REFUSALS.labels("acme", "llm-large", "stored_responses_quota")
    assert refusals._value.get() >= 2


async def test_past_the_byte_quota_a_request_is_refused_or_its_answer_not_stored(
    config_for: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = config_for(edit_tenants=quota(max_bytes=8_000))
    async with started_gateway(path, monkeypatch) as gw:
        gw.upstream.script("llm-large", Completion("ok", usage=Usage(1, 1)))
        async with gw.http() as client:
            first = await client.post("/v1/responses", json=body(input="a" * 3_000))
            assert first.status_code == 200 and "x-gateway-not-stored" not in first.headers
            # No room beside the first for a record holding at least this body: refused
            # before it runs, the message says what it needs.
            calls = len(gw.upstream.calls)
            refused = await client.post("/v1/responses", json=body(input="b" * 5_000))
            assert refused.status_code == 429
            error = refused.json()["error"]
            assert error["code"] == "stored_responses_quota_exceeded"
            assert "of 8,000 bytes, and this answer needs" in error["message"]
            assert "stored_responses.max_bytes" in error["message"]
            assert len(gw.upstream.calls) == calls
            # A small request whose answer turns out large: answered, not stored, and the
            # header says why.
            gw.upstream.script("llm-large", Completion("c" * 5_000, usage=Usage(1, 1)))
            second = await client.post("/v1/responses", json=body())
            assert second.status_code == 200
            assert second.headers["x-gateway-not-stored"] == "stored_responses.max_bytes"
            gone = await client.get(f"/v1/responses/{second.json()['id']}")
            assert gone.status_code == 404
            not_kept = metrics.STORED_RESPONSES_REFUSED.labels("acme", "max_bytes")
            assert not_kept._value.get() >= 1
            # A small one still fits.
            gw.upstream.script("llm-large", Completion("ok", usage=Usage(1, 1)))
            assert (await client.post("/v1/responses", json=body())).status_code == 200
            exposition = metrics.render().decode()
            assert 'gateway_stored_responses_quota{tenant="acme",unit="bytes"} 8000.0' in exposition
            assert 'gateway_stored_responses{tenant="acme"} 2.0' in exposition


@pytest.fixture
async def with_tools(
    config_for: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[InProcessGateway]:
    """llm-large runs function tools."""

    def edit(config: dict[str, Any]) -> None:
        for name in ("llm-large", "llm-small"):
            config["models"][name]["capabilities"] = {"tools": True, "tool_parser": "hermes"}

    async with started_gateway(config_for(edit), monkeypatch) as started:
        yield started


async def test_a_stored_response_keeps_no_extra_tool_field(with_tools: InProcessGateway) -> None:
    gw = with_tools
    gw.upstream.script("llm-large", Completion("ok", usage=Usage(1, 1)))
    tools = [
        {"type": "web_search", "search_context_size": "low", "padding": JUNK},
        {"type": "function", "name": "f", "parameters": {"type": "object"}, "padding": JUNK},
    ]
    async with gw.http() as client:
        answer = await client.post("/v1/responses", json=body(tools=tools))
        assert answer.status_code == 200, answer.text
        assert len(answer.content) < 4_000
        stored = await client.get(f"/v1/responses/{answer.json()['id']}")
        assert stored.json()["tools"] == [
            {"type": "web_search", "search_context_size": "low"},
            {"type": "function", "name": "f", "parameters": {"type": "object"}},
        ]


@pytest.mark.parametrize(
    "tools",
    [
        [{"type": "web_search", "filters": {"allowed_domains": [JUNK]}}],  # huge
        [{"type": "mcp", "server_label": "s", "allowed_tools": [["x"] * 5_000]}],  # big, deep
        [{"type": 7}],  # malformed
        [{"type": "web_search"}, "not a tool"],  # wrong type
        {"type": "web_search"},  # not a list
    ],
)
async def test_worst_tools_are_a_400_never_a_500(
    with_tools: InProcessGateway, tools: object
) -> None:
    async with with_tools.http() as client:
        answer = await client.post("/v1/responses", json=body(tools=tools))
    assert answer.status_code == 400
    assert answer.json()["error"]["param"].startswith("tools")
