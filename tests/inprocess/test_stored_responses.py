"""Stored Responses API answers through the gateway (issue 40): each tenant's under its
quota (`stored_responses` in tenants.yaml), refused with a 429 naming the quota before
any inference, room given back by a delete; what is stored holds only the tools' known
fields; the quota and what is held visible in /metrics."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.config import hash_key
from gateway.inference.types import Completion, Usage
from gateway.observability import metrics
from tests.inprocess.conftest import KEYS, InProcessGateway, started_gateway

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


# --- ownership: a stored response and an Idempotency-Key record are their key's ----------

ADMIN_KEY = "sk-test-stored-admin"
SECOND_ACME_KEY = "sk-test-acme-second"


def two_acme_keys_and_an_admin(tenants: dict[str, Any]) -> None:
    tenants["tenants"]["acme"]["api_keys"].append(hash_key(SECOND_ACME_KEY))
    tenants["tenants"]["ops"] = {"api_keys": [hash_key(ADMIN_KEY)], "models": [], "admin": True}


@pytest.fixture
async def owners(
    config_for: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[InProcessGateway]:
    """acme with two keys of tenants.yaml, and an admin tenant."""
    path = config_for(edit_tenants=two_acme_keys_and_an_admin)
    async with started_gateway(path, monkeypatch) as started:
        yield started


async def test_another_key_of_the_tenant_cannot_read_continue_or_delete_a_response(
    owners: InProcessGateway,
) -> None:
    gw = owners
    gw.upstream.script("llm-large", Completion("secret answer", usage=Usage(1, 1)))
    async with gw.http() as first, gw.http(SECOND_ACME_KEY) as second:
        made = await first.post("/v1/responses", json=body(input="my secret question"))
        response_id = made.json()["id"]
        # Read, continued, deleted by the second key: 404, as an unknown id.
        read = await second.get(f"/v1/responses/{response_id}")
        assert read.status_code == 404
        assert read.json()["error"]["code"] == "response_not_found"
        calls = len(gw.upstream.calls)
        continued = await second.post(
            "/v1/responses", json=body(input="and?", previous_response_id=response_id)
        )
        assert continued.status_code == 404
        assert continued.json()["error"]["param"] == "previous_response_id"
        assert len(gw.upstream.calls) == calls  # nothing of it went upstream
        assert (await second.delete(f"/v1/responses/{response_id}")).status_code == 404
        # Its owner still has it whole.
        assert (await first.get(f"/v1/responses/{response_id}")).status_code == 200
        again = await first.post(
            "/v1/responses", json=body(input="and?", previous_response_id=response_id)
        )
        assert again.status_code == 200
    # The tenant's admin (here the global admin) reads it, and sees whose it is.
    async with gw.http(ADMIN_KEY) as admin:
        seen = await admin.get(f"/admin/responses/{response_id}", params={"tenant": "acme"})
        assert seen.status_code == 200
        assert seen.json()["owner"] == hash_key(KEYS["acme"]).removeprefix("sha256:")[:12]
        assert seen.json()["response"]["output"][0]["content"][0]["text"] == "secret answer"
        for params in ({"tenant": "globex"}, {"tenant": "nobody"}):
            missing = await admin.get(f"/admin/responses/{response_id}", params=params)
            assert missing.status_code == 404
        unnamed = await admin.get(f"/admin/responses/{response_id}")
        assert unnamed.status_code == 400 and unnamed.json()["error"]["code"] == "missing_tenant"
        # And deletes it, whichever key made it: the way out when one key filled the
        # quota all the tenant's keys share (a key cannot delete another's).
        where = f"/admin/responses/{response_id}"
        assert (await admin.delete(where, params={"tenant": "globex"})).status_code == 404
        deleted = await admin.delete(where, params={"tenant": "acme"})
        assert deleted.status_code == 200 and deleted.json()["deleted"] is True
        assert (await admin.get(where, params={"tenant": "acme"})).status_code == 404
        assert (await admin.delete(where, params={"tenant": "acme"})).status_code == 404
    async with gw.http() as first:  # a tenant's own key is not an admin
        refused = await first.get(f"/admin/responses/{response_id}", params={"tenant": "acme"})
        assert refused.status_code == 403


async def test_another_key_re_sending_an_idempotency_key_gets_its_own_run(
    owners: InProcessGateway,
) -> None:
    gw = owners
    request = {"model": "llm-large", "messages": [{"role": "user", "content": "hi"}]}
    headers = {"idempotency-key": "order-42"}
    gw.upstream.script("llm-large", Completion("first key's answer", usage=Usage(1, 1)))
    async with gw.http() as first, gw.http(SECOND_ACME_KEY) as second:
        one = await first.post("/v1/chat/completions", json=request, headers=headers)
        assert one.status_code == 200
        replayed = await first.post("/v1/chat/completions", json=request, headers=headers)
        assert replayed.headers.get("idempotent-replayed") == "true"
        assert replayed.json() == one.json()
        calls = len(gw.upstream.calls)
        gw.upstream.script("llm-large", Completion("second key's answer", usage=Usage(1, 1)))
        two = await second.post("/v1/chat/completions", json=request, headers=headers)
        assert two.status_code == 200
        assert "idempotent-replayed" not in two.headers
        assert two.json()["choices"][0]["message"]["content"] == "second key's answer"
        assert len(gw.upstream.calls) == calls + 1  # its own run
        # And each key's repeat gets its own answer.
        again = await second.post("/v1/chat/completions", json=request, headers=headers)
        assert again.json()["choices"][0]["message"]["content"] == "second key's answer"


@pytest.mark.parametrize(
    "path",
    [
        "/admin/responses/" + "x" * 10_000,
        "/admin/responses/%00%ff",
        "/admin/responses/resp_1?tenant=" + "t" * 10_000,
        "/admin/responses/resp_1?tenant=acme&tenant=globex",
    ],
)
async def test_worst_admin_reads_are_a_4xx(owners: InProcessGateway, path: str) -> None:
    async with owners.http(ADMIN_KEY) as admin:
        answer = await admin.get(path)
    assert 400 <= answer.status_code < 500
