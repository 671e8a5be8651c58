"""A managed key's own limits cover everything it sends, not only its inference: the
requests that ask for none (`count_tokens`, stored-response reads) and the ones the
gateway refuses take the key's rpm too, so that one key cannot spend its tenant's
shared limit past its own (issue 40, finding 4)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.inprocess.conftest import KEYS, started_gateway
from tests.inprocess.test_admin_keys import ADMIN_KEY, with_admin

CHAT = {"model": "llm-small", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
COUNT = {"model": "llm-small", "messages": [{"role": "user", "content": "hi"}]}


def with_tenant_limit(tenants: dict[str, Any]) -> None:
    """The admin tenant, and acme at 6 requests a minute: a key at 2 may not take it all."""
    with_admin(tenants)
    tenants["tenants"]["acme"]["limits"] = {"requests_per_minute": 6}


@pytest.mark.parametrize("sent", ["count_tokens", "stored read", "bad body"])
async def test_a_keys_rpm_takes_what_asks_for_no_inference_and_what_is_refused(
    config_for: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, sent: str
) -> None:
    """A key at 2 rpm sends 5 of `sent`: 2 are served (or refused for themselves), the
    rest are 429 naming the key's limit; the tenant's main key still has 4 of its 6."""
    path = config_for(edit_tenants=with_tenant_limit)
    async with started_gateway(path, monkeypatch) as gw:
        async with gw.http(ADMIN_KEY) as admin:
            made = await admin.post(
                "/admin/keys",
                json={"tenant": "acme", "name": "eval-run", "limits": {"requests_per_minute": 2}},
            )
            assert made.status_code == 201, made.text
        statuses = []
        async with gw.http(made.json()["key"]) as client:
            for _ in range(5):
                if sent == "count_tokens":
                    answer = await client.post("/v1/messages/count_tokens", json=COUNT)
                elif sent == "stored read":
                    answer = await client.get("/v1/responses/resp_missing")
                else:
                    answer = await client.post("/v1/chat/completions", content=b"{nope")
                statuses.append(answer.status_code)
                if answer.status_code == 429:
                    assert answer.headers["x-ratelimit-limit-requests"] == "2"
                    assert "for this API key" in answer.text
                    assert float(answer.headers["retry-after"]) > 0
        first = {"count_tokens": 200, "stored read": 404, "bad body": 400}[sent]
        assert statuses == [first, first, 429, 429, 429]
        async with gw.http(KEYS["acme"]) as main:
            served = [(await main.post("/v1/chat/completions", json=CHAT)) for _ in range(4)]
        assert [answer.status_code for answer in served] == [200] * 4
