"""`/admin/keys` in the app: a key made through the admin API serves the openai SDK at
once, is held to its own rate, is refused (401) once revoked, and every hostile body is
a 4xx, never a 5xx."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from gateway.config import hash_key
from tests.inprocess.conftest import KEYS, started_gateway

ADMIN_KEY = "sk-test-keys-admin"


def with_admin(tenants: dict[str, Any]) -> None:
    tenants["tenants"]["ops"] = {"api_keys": [hash_key(ADMIN_KEY)], "models": [], "admin": True}


async def test_a_key_made_by_the_admin_api_serves_until_it_is_revoked(
    config_for: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    async with started_gateway(config_for(edit_tenants=with_admin), monkeypatch) as gw:
        async with gw.http(ADMIN_KEY) as admin:
            made = await admin.post(
                "/admin/keys",
                json={
                    "tenant": "globex",
                    "name": "ci",
                    "models": ["llm-small"],
                    "expires_at": "2999-01-01T00:00:00Z",
                    "budget": {"amount": 0.05, "period": "day"},
                    "limits": {"requests_per_minute": 30},
                },
            )
            assert made.status_code == 201, made.text
            record = made.json()
            plain, key_id = record["key"], record["id"]
            assert plain.startswith("sk-") and key_id.startswith("key_")
            assert record["budget"]["amount"] == 0.05 and record["models"] == ["llm-small"]
            assert record["expires_at"] == "2999-01-01T00:00:00Z"
            assert "key_hash" not in record and hash_key(plain) not in made.text

            client = gw.openai(plain)
            answer = await client.chat.completions.create(
                model="llm-small", messages=[{"role": "user", "content": "hi"}]
            )
            assert answer.choices[0].message.content
            # The key's models are a subset of its tenant's.
            with pytest.raises(openai.PermissionDeniedError):
                await client.chat.completions.create(
                    model="llm-large", messages=[{"role": "user", "content": "hi"}]
                )

            listed = (await admin.get("/admin/keys", params={"tenant": "globex"})).json()
            assert [k["id"] for k in listed["data"]] == [key_id]
            assert "key" not in listed["data"][0] and plain not in str(listed)
            got = await admin.get(f"/admin/keys/{key_id}")
            assert got.status_code == 200 and got.json()["name"] == "ci"
            patched = await admin.patch(f"/admin/keys/{key_id}", json={"name": "ci-2"})
            assert patched.status_code == 200 and patched.json()["name"] == "ci-2"

            rotated = await admin.post(f"/admin/keys/{key_id}/rotate")
            assert rotated.status_code == 200
            new_plain = rotated.json()["key"]
            assert new_plain != plain

            def refused(key: str) -> Callable[[], Awaitable[bool]]:
                async def check() -> bool:
                    try:
                        await gw.openai(key).models.list()
                    except openai.AuthenticationError:
                        return True
                    return False

                return check

            # At once on this gateway, which made the change: its answer came after its
            # own directory had looked (the others' look: test_key_store).
            assert await refused(plain)()
            new_client = gw.openai(new_plain)
            await new_client.chat.completions.create(
                model="llm-small", messages=[{"role": "user", "content": "hi"}]
            )

            revoked = await admin.delete(f"/admin/keys/{key_id}")
            assert revoked.status_code == 200 and revoked.json()["status"] == "revoked"
            assert await refused(new_plain)()
            with pytest.raises(openai.AuthenticationError):
                await new_client.chat.completions.create(
                    model="llm-small", messages=[{"role": "user", "content": "hi"}]
                )
            assert (await admin.get("/admin/keys/key_0000000000000000")).status_code == 404
            again = await admin.post(f"/admin/keys/{key_id}/rotate")
            assert again.status_code == 409

        # Only admins: another tenant's key is a 403, no key a 401.
        async with gw.http(KEYS["acme"]) as tenant:
            assert (await tenant.get("/admin/keys")).status_code == 403
        async with gw.http(None) as nobody:
            assert (await nobody.post("/admin/keys", json={})).status_code == 401


async def test_a_keys_own_rate_refuses_that_key_while_its_tenant_goes_on(
    config_for: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`limits: {requests_per_minute: 2}` on a key of a tenant without limits: its third
    request in the minute is a 429 with Retry-After, the tenant's other key goes on."""
    async with started_gateway(config_for(edit_tenants=with_admin), monkeypatch) as gw:
        async with gw.http(ADMIN_KEY) as admin:
            made = await admin.post(
                "/admin/keys",
                json={"tenant": "acme", "name": "cron", "limits": {"requests_per_minute": 2}},
            )
            assert made.status_code == 201, made.text
        client = gw.openai(made.json()["key"])
        ask: dict[str, Any] = {
            "model": "llm-small", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
        }  # fmt: skip
        for _ in range(2):
            await client.chat.completions.create(**ask)
        with pytest.raises(openai.RateLimitError) as refused:
            await client.chat.completions.create(**ask)
        assert refused.value.response.headers["x-ratelimit-limit-requests"] == "2"
        assert 0 < float(refused.value.response.headers["retry-after"]) <= 30
        assert refused.value.code == "rate_limit_exceeded"
        assert "2 requests per minute for this API key" in refused.value.message
        for _ in range(3):
            await gw.openai(KEYS["acme"]).chat.completions.create(**ask)


def _deep(levels: int) -> str:
    return "[" * levels + "]" * levels


GOOD = {"tenant": "acme", "name": "ci"}
HOSTILE: list[tuple[str, Any]] = [
    ("name too long", {**GOOD, "name": "x" * 129}),
    ("huge name", {**GOOD, "name": "x" * 60_000}),
    ("name not a string", {**GOOD, "name": 7}),
    ("no name", {"tenant": "acme"}),
    ("unknown tenant", {**GOOD, "tenant": "nobody"}),
    ("tenant not a string", {**GOOD, "tenant": ["acme"]}),
    ("model not the tenant's", {**GOOD, "tenant": "globex", "models": ["llm-large"]}),
    ("unknown model", {**GOOD, "models": ["no-such-model"]}),
    ("models not a list", {**GOOD, "models": "llm-small"}),
    ("negative budget", {**GOOD, "budget": {"amount": -1, "period": "day"}}),
    ("zero budget", {**GOOD, "budget": {"amount": 0, "period": "day"}}),
    ("budget not a number", {**GOOD, "budget": {"amount": "lots", "period": "day"}}),
    ("budget a boolean", {**GOOD, "budget": {"amount": True, "period": "day"}}),
    ("budget huge", {**GOOD, "budget": {"amount": 1e308, "period": "day"}}),
    ("bad period", {**GOOD, "budget": {"amount": 1, "period": "week"}}),
    ("budget not an object", {**GOOD, "budget": 5}),
    ("expired", {**GOOD, "expires_at": "2001-01-01T00:00:00Z"}),
    ("expiry not a time", {**GOOD, "expires_at": "tomorrow"}),
    ("expiry a list", {**GOOD, "expires_at": [1]}),
    # Found by the hostile review: written, then a 500, and every list a 500 after.
    ("expiry past year 9999", {**GOOD, "expires_at": 1e20}),
    ("expiry in year 10000", {**GOOD, "expires_at": "9999-12-31T23:59:59-12:00"}),
    # Found by the hostile review: taken, then every request of the key a 500.
    ("budget under a micro-unit", {**GOOD, "budget": {"amount": 1e-9, "period": "day"}}),
    ("negative limit", {**GOOD, "limits": {"requests_per_minute": -5}}),
    ("unknown field", {**GOOD, "owner": "me"}),
    ("not an object", [GOOD]),
]


async def test_hostile_bodies_are_refused_with_a_4xx(
    config_for: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = config_for(edit_tenants=with_admin)
    async with started_gateway(path, monkeypatch) as gw, gw.http(ADMIN_KEY) as admin:
        for label, body in HOSTILE:
            answer = await admin.post("/admin/keys", json=body)
            assert answer.status_code == 400, (label, answer.text)
            assert answer.json()["error"]["type"] == "invalid_request_error", label
        # Nothing refused was written: the list still answers, and holds none of them.
        listed = await admin.get("/admin/keys")
        assert listed.status_code == 200 and listed.json()["data"] == []
        raw = {
            "deep": f'{{"tenant": "acme", "name": "ci", "models": {_deep(5000)}}}',
            "not json": "{tenant",
            "too big": '{"name": "' + "x" * 200_000 + '"}',
        }
        for label, text in raw.items():
            answer = await admin.post(
                "/admin/keys", content=text, headers={"content-type": "application/json"}
            )
            assert 400 <= answer.status_code < 500, (label, answer.text)
        made = (await admin.post("/admin/keys", json=GOOD)).json()
        for label, body in [
            ("patch tenant", {"tenant": "globex"}),
            ("patch nothing", {}),
            ("patch huge name", {"name": "y" * 1000}),
            ("patch negative budget", {"budget": {"amount": -0.01}}),
        ]:
            answer = await admin.patch(f"/admin/keys/{made['id']}", json=body)
            assert answer.status_code == 400, (label, answer.text)
        long_id = "key_" + "0" * 5000
        assert (await admin.get(f"/admin/keys/{long_id}")).status_code == 404
        assert (await admin.patch("/admin/keys/nope", json={"name": "x"})).status_code == 404
        assert (await admin.delete("/admin/keys/nope")).status_code == 404
        listed = await admin.get("/admin/keys", params={"tenant": "nobody"})
        assert listed.status_code == 404
