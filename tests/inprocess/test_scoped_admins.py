"""A tenant's own admin (issue 40): a managed key with `admin_of` manages its tenant's
keys and reads its usage and stored responses, and nothing of another tenant's; it
cannot make another admin, widen its scope or become global; the global admin (a key of
an `admin: true` tenant) stays global. Every hostile `admin_of` is a 4xx."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.config import hash_key
from gateway.inference.types import Completion, Usage
from tests.inprocess.conftest import KEYS, InProcessGateway, started_gateway
from tests.inprocess.test_usage_ledger import with_ledger

ADMIN_KEY = "sk-test-global-admin"
CHAT = {"model": "llm-small", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
async def gw(
    config_for: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> AsyncIterator[InProcessGateway]:
    """An `ops` tenant whose key is the global admin; a usage ledger."""

    def tenants(data: dict[str, Any]) -> None:
        data["tenants"]["ops"] = {"api_keys": [hash_key(ADMIN_KEY)], "models": [], "admin": True}

    path = config_for(edit=with_ledger(tmp_path), edit_tenants=tenants)
    async with started_gateway(path, monkeypatch) as started:
        yield started


async def made(admin: httpx.AsyncClient, **fields: Any) -> dict[str, Any]:
    answer = await admin.post("/admin/keys", json={"name": "k", **fields})
    assert answer.status_code == 201, answer.text
    record: dict[str, Any] = answer.json()
    return record


async def test_a_scoped_admin_manages_its_tenant_s_keys_and_no_other_s(
    gw: InProcessGateway,
) -> None:
    async with gw.http(ADMIN_KEY) as root:
        acme_admin = await made(root, tenant="acme", admin_of="acme")
        assert acme_admin["admin_of"] == "acme"
        globex_key = await made(root, tenant="globex")
        listed = (await root.get("/admin/keys")).json()["data"]  # global: every tenant's
        assert {k["tenant"] for k in listed} == {"acme", "globex"}
    async with gw.http(acme_admin["key"]) as scoped:
        # Its own tenant: create, list, get, update, rotate, revoke.
        mine = await made(scoped, tenant="acme", models=["llm-small"])
        listed = (await scoped.get("/admin/keys")).json()["data"]
        assert {k["tenant"] for k in listed} == {"acme"}
        assert {k["id"] for k in listed} == {acme_admin["id"], mine["id"]}
        assert (await scoped.get("/admin/keys", params={"tenant": "acme"})).status_code == 200
        assert (await scoped.get(f"/admin/keys/{mine['id']}")).status_code == 200
        patched = await scoped.patch(f"/admin/keys/{mine['id']}", json={"name": "renamed"})
        assert patched.status_code == 200 and patched.json()["name"] == "renamed"
        assert (await scoped.post(f"/admin/keys/{mine['id']}/rotate")).status_code == 200
        assert (await scoped.delete(f"/admin/keys/{mine['id']}")).status_code == 200
        # Another tenant's: create refused, list and every key id as if unknown.
        other = await scoped.post("/admin/keys", json={"tenant": "globex", "name": "x"})
        assert other.status_code == 403
        assert other.json()["error"]["code"] == "tenant_not_administered"
        for tenant in ("globex", "ops", "nobody"):
            hidden = await scoped.get("/admin/keys", params={"tenant": tenant})
            assert hidden.status_code == 404
            assert hidden.json()["error"]["code"] == "tenant_not_found"
        gid = globex_key["id"]
        for method, path in [
            ("GET", f"/admin/keys/{gid}"),
            ("PATCH", f"/admin/keys/{gid}"),
            ("DELETE", f"/admin/keys/{gid}"),
            ("POST", f"/admin/keys/{gid}/rotate"),
        ]:
            body = {"name": "taken"} if method == "PATCH" else None
            answer = await scoped.request(method, path, json=body)
            assert answer.status_code == 404, (method, path)
            assert answer.json()["error"]["code"] == "key_not_found"
        # The global admin's own endpoints stay its own.
        assert (await scoped.post("/admin/reload")).status_code == 403
        assert (await scoped.get("/metrics")).status_code == 403
    async with gw.http(ADMIN_KEY) as root:
        still = (await root.get(f"/admin/keys/{gid}")).json()
        assert still["status"] == "active" and still["name"] == "k"  # untouched


async def test_a_scoped_admin_cannot_escalate(gw: InProcessGateway) -> None:
    async with gw.http(ADMIN_KEY) as root:
        acme_admin = await made(root, tenant="acme", admin_of="acme")
    async with gw.http(acme_admin["key"]) as scoped:
        attempts = [
            ("POST", "/admin/keys", {"tenant": "acme", "name": "x", "admin_of": "acme"}),
            ("POST", "/admin/keys", {"tenant": "acme", "name": "x", "admin_of": "globex"}),
            ("POST", "/admin/keys", {"tenant": "ops", "name": "x"}),  # a global admin's key
            ("PATCH", f"/admin/keys/{acme_admin['id']}", {"admin_of": "globex"}),
            ("PATCH", f"/admin/keys/{acme_admin['id']}", {"admin_of": "ops"}),
            ("PATCH", f"/admin/keys/{acme_admin['id']}", {"admin_of": None}),
        ]
        for method, path, body in attempts:
            answer = await scoped.request(method, path, json=body)
            assert answer.status_code == 403, (body, answer.text)
        # A plain key it made cannot be raised either, nor use the admin API.
        plain = await made(scoped, tenant="acme")
        raised = await scoped.patch(f"/admin/keys/{plain['id']}", json={"admin_of": "acme"})
        assert raised.status_code == 403
        async with gw.http(plain["key"]) as nobody:
            assert (await nobody.get("/admin/keys")).status_code == 403
    async with gw.http(ADMIN_KEY) as root:
        record = (await root.get(f"/admin/keys/{acme_admin['id']}")).json()
        assert record["admin_of"] == "acme"  # unchanged
        # The global admin may unmake it: its admin API is gone within the same gateway.
        demoted = await root.patch(f"/admin/keys/{acme_admin['id']}", json={"admin_of": None})
        assert demoted.status_code == 200 and demoted.json()["admin_of"] is None
    async with gw.http(acme_admin["key"]) as former:
        assert (await former.get("/admin/keys")).status_code == 403


async def test_a_scoped_admin_reads_its_tenant_s_usage_and_responses_only(
    gw: InProcessGateway,
) -> None:
    gw.upstream.script("llm-small", Completion("ok", usage=Usage(2, 1)))
    gw.upstream.script("llm-large", Completion("ok", usage=Usage(2, 1)))
    async with gw.http(ADMIN_KEY) as root:
        acme_admin = await made(root, tenant="acme", admin_of="acme")
    async with gw.http() as acme, gw.http(KEYS["globex"]) as globex:
        assert (await acme.post("/v1/chat/completions", json=CHAT)).status_code == 200
        assert (await globex.post("/v1/chat/completions", json=CHAT)).status_code == 200
        acme_response = (
            await acme.post("/v1/responses", json={"model": "llm-large", "input": "hi"})
        ).json()["id"]
        globex_response = (
            await globex.post("/v1/responses", json={"model": "llm-small", "input": "hi"})
        ).json()["id"]
    globex_key_id = hash_key(KEYS["globex"]).removeprefix("sha256:")[:12]
    async with gw.http(acme_admin["key"]) as scoped, gw.http(ADMIN_KEY) as root:
        for _ in range(100):  # the ledger writes in batches, every 50 ms
            rows = (await root.get("/admin/usage", params={"by": "tenant"})).json()["rows"]
            if {r["tenant"] for r in rows} >= {"acme", "globex"}:
                break
            await asyncio.sleep(0.05)
        report = await scoped.get("/admin/usage", params={"by": "tenant,key"})
        assert report.status_code == 200
        assert {row["tenant"] for row in report.json()["rows"]} == {"acme"}
        csv = await scoped.get("/admin/usage", params={"by": "tenant", "format": "csv"})
        assert "globex" not in csv.text
        for tenant in ("globex", "nobody"):
            hidden = await scoped.get("/admin/usage", params={"tenant": tenant})
            assert hidden.status_code == 404
        other = await scoped.get("/admin/usage/requests", params={"key": globex_key_id})
        assert other.status_code == 200 and other.json()["data"] == []  # none of its tenant's
        seen = await root.get("/admin/usage/requests", params={"key": globex_key_id})
        assert seen.json()["data"]  # the global admin sees them
        global_report = await root.get("/admin/usage", params={"by": "tenant", "tenant": "acme"})
        assert {row["tenant"] for row in global_report.json()["rows"]} == {"acme"}
        # Stored responses: its tenant's, any key's; another tenant's not found.
        mine = await scoped.get(f"/admin/responses/{acme_response}")
        assert mine.status_code == 200 and mine.json()["tenant"] == "acme"
        assert (await scoped.get(f"/admin/responses/{globex_response}")).status_code == 404
        hidden = await scoped.get(
            f"/admin/responses/{globex_response}", params={"tenant": "globex"}
        )
        assert hidden.status_code == 404
        # The global admin names the tenant, and is told so when it does not.
        unnamed = await root.get(f"/admin/responses/{globex_response}")
        assert unnamed.status_code == 400 and "?tenant=NAME" in unnamed.json()["error"]["message"]
        assert unnamed.json()["error"]["param"] == "tenant"
        found = await root.get(f"/admin/responses/{globex_response}", params={"tenant": "globex"})
        assert found.status_code == 200


HOSTILE_ADMIN_OF: list[tuple[str, object]] = [
    ("another tenant", "globex"),
    ("unknown tenant", "nobody"),
    ("huge", "a" * 60_000),  # within the admin API's 64 KiB body
    ("a number", 7),
    ("a list", ["acme"]),
    ("an object", {"tenant": "acme"}),
    ("deep", [[[[[[[[[[[[[[[[["acme"]]]]]]]]]]]]]]]]]),
    ("empty", ""),
    ("a boolean", True),
]


async def test_an_admin_of_past_the_body_limit_is_a_413(gw: InProcessGateway) -> None:
    async with gw.http(ADMIN_KEY) as root:
        body = {"tenant": "acme", "name": "k", "admin_of": "a" * 100_000}
        assert (await root.post("/admin/keys", json=body)).status_code == 413


@pytest.mark.parametrize(("label", "value"), HOSTILE_ADMIN_OF)
async def test_every_hostile_admin_of_is_a_400_naming_it(
    gw: InProcessGateway, label: str, value: object
) -> None:
    async with gw.http(ADMIN_KEY) as root:
        created = await root.post(
            "/admin/keys", json={"tenant": "acme", "name": "k", "admin_of": value}
        )
        assert created.status_code == 400, (label, created.text)
        assert created.json()["error"]["param"] == "admin_of"
        key = await made(root, tenant="acme")
        patched = await root.patch(f"/admin/keys/{key['id']}", json={"admin_of": value})
        assert patched.status_code == 400, (label, patched.text)
        # A key of an admin tenant is global already: a scope would not scope it.
        ops = await root.post("/admin/keys", json={"tenant": "ops", "name": "k", "admin_of": "ops"})
        assert ops.status_code == 400
