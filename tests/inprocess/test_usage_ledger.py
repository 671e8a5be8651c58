"""The usage ledger behind a running gateway: a record a request, priced, reported."""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.config.keys import hash_key
from gateway.inference.types import Completion, Usage
from gateway.observability import metrics
from gateway_tools.usage_cli import run_report
from tests.inprocess.conftest import KEYS, started_gateway
from tests.polling import wait_until

CHAT = {"model": "llm-large", "messages": [{"role": "user", "content": "Hello"}]}


def with_ledger(tmp_path: Path) -> Callable[[dict[str, Any]], None]:
    def edit(config: dict[str, Any]) -> None:
        config["ledger"] = {
            "url": f"sqlite:///{tmp_path}/usage.db",
            "spool_dir": str(tmp_path / "spool"),
            "flush_interval_ms": 50,
        }
        config["prices"] = {
            "currency": "EUR",
            "models": {
                "llm-large": {
                    "input_per_million": 3.0,
                    "cached_input_per_million": 0.3,
                    "output_per_million": 15.0,
                }
            },
        }

    return edit


def requests_counted(tenant: str, status: str) -> float:
    labels = {
        "tenant": tenant, "model": "llm-large", "served_model": "llm-large",
        "status": status, "endpoint": "chat",
    }  # fmt: skip
    return metrics.REGISTRY.get_sample_value("gateway_requests_total", labels) or 0.0


def ledger_written() -> float:
    return metrics.REGISTRY.get_sample_value("gateway_ledger_records_written_total") or 0.0


async def test_every_request_is_recorded_once_priced_and_reported(
    config_for: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = config_for(edit=with_ledger(tmp_path))
    before = requests_counted("acme", "200")
    written_before = ledger_written()
    async with started_gateway(path, monkeypatch) as gw:
        for _ in range(3):
            gw.upstream.script("llm-large", Completion("Hi!", Usage(1000, 200, cached_tokens=400)))
        async with gw.http() as client:
            answers = [await client.post("/v1/chat/completions", json=CHAT) for _ in range(3)]
            refused = await client.post("/v1/chat/completions", json={"model": "nope"})
    # The gateway has stopped: every record is written.
    assert [a.status_code for a in answers] == [200, 200, 200] and refused.status_code == 404
    rows = (
        sqlite3.connect(tmp_path / "usage.db")
        .execute(
            "SELECT request_id, tenant, key_id, model_served, prompt_tokens, cached_tokens,"
            " completion_tokens, cost_micros, status FROM usage_ledger ORDER BY status"
        )
        .fetchall()
    )
    served = [row for row in rows if row[-1] == 200]
    assert sorted(row[0] for row in served) == sorted(a.headers["x-request-id"] for a in answers)
    # 600 prompt tokens at 3.0 a million, 400 cached at 0.3, 200 out at 15.0: micro-euros.
    assert {row[1:] for row in served} == {
        ("acme", row[2], "llm-large", 1000, 400, 200, 1800 + 120 + 3000, 200) for row in served
    }
    assert all(len(row[2]) == 12 for row in served)  # which key, not the key
    assert [row[-1] for row in rows if row[-1] != 200] == [404]
    # Neither the served nor the unknown model (not a refusal of the gateway's) has an
    # outcome.
    outcomes = sqlite3.connect(tmp_path / "usage.db").execute(
        "SELECT status, outcome FROM usage_ledger ORDER BY status"
    )
    assert outcomes.fetchall() == [(200, ""), (200, ""), (200, ""), (404, "")]
    # The ledger's figures are the counters' figures, and it says what it wrote.
    assert requests_counted("acme", "200") - before == len(served)
    assert ledger_written() - written_before == len(rows)

    report = argparse.Namespace(
        config=str(path), by="tenant,model", since="1h", until=None, csv=True
    )
    # The CLI runs its own event loop, as from a shell.
    assert await asyncio.to_thread(run_report, report) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("tenant,model,requests,prompt_tokens,cached_tokens")
    [large] = [line for line in lines if line.startswith("acme,llm-large,")]
    # No bytes in or out (no MCP tool call), then 0 errors.
    assert large.startswith("acme,llm-large,3,3000,1200,600,14760,0,0,0,")
    assert any(line.startswith("acme,,1,") for line in lines)  # the 404: no model served
    assert KEYS["acme"] not in "".join(lines)


async def test_a_refused_request_is_recorded_with_its_reason_as_its_outcome(
    config_for: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = config_for(edit=with_ledger(tmp_path))
    async with started_gateway(path, monkeypatch) as gw:
        for _ in range(2):
            gw.upstream.script("llm-large", Completion("Hi!", Usage(1000, 200, cached_tokens=400)))
        async with gw.http(KEYS["tight"]) as client:  # 2 requests a minute
            answers = [await client.post("/v1/chat/completions", json=CHAT) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    rows = (
        sqlite3.connect(tmp_path / "usage.db")
        .execute("SELECT request_id, tenant, status, outcome FROM usage_ledger ORDER BY ts")
        .fetchall()
    )
    # The two served: no outcome; the one refused: the reason it was refused.
    assert rows == [
        (answers[0].headers["x-request-id"], "tight", 200, ""),
        (answers[1].headers["x-request-id"], "tight", 200, ""),
        (answers[2].headers["x-request-id"], "tight", 429, "rate_requests"),
    ]

    report = argparse.Namespace(
        config=str(path), by="tenant,outcome", since="1h", until=None, csv=True
    )
    assert await asyncio.to_thread(run_report, report) == 0
    lines = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["tenant"], r["outcome"], r["requests"], r["errors"]) for r in lines] == [
        ("tight", "", "2", "0"),
        ("tight", "rate_requests", "1", "1"),
    ]


ADMIN_KEY = "sk-test-ops-admin"


def with_admin(tenants: dict[str, Any]) -> None:
    tenants["tenants"]["ops"] = {"api_keys": [hash_key(ADMIN_KEY)], "models": [], "admin": True}


async def test_the_admin_api_reports_usage_to_admins_only(
    config_for: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = config_for(edit=with_ledger(tmp_path), edit_tenants=with_admin)
    async with started_gateway(path, monkeypatch) as gw:
        gw.upstream.script("llm-large", Completion("Hi!", Usage(1000, 200, cached_tokens=400)))
        async with gw.http() as client:
            assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
            denied = await client.get("/admin/usage")
        assert denied.status_code == 403
        async with gw.http(ADMIN_KEY) as admin:

            async def reported() -> bool:
                answer = await admin.get("/admin/usage", params={"by": "tenant,model"})
                rows = answer.json()["rows"]
                return any(r["tenant"] == "acme" and r["requests"] == 1 for r in rows)

            await wait_until(reported)  # written within its flush interval
            answer = await admin.get("/admin/usage", params={"by": "model", "format": "csv"})
            bad = await admin.get("/admin/usage", params={"by": "colour"})
    assert answer.headers["content-type"].startswith("text/csv")
    assert "llm-large,1,1000,400,200,4920," in answer.text
    assert bad.status_code == 400 and "colour" in bad.json()["error"]["message"]


async def test_one_keys_requests_are_listed_to_admins_as_recorded(
    config_for: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = config_for(edit=with_ledger(tmp_path), edit_tenants=with_admin)
    async with started_gateway(path, monkeypatch) as gw:
        for _ in range(2):
            gw.upstream.script("llm-large", Completion("Hi!", Usage(1000, 200, cached_tokens=400)))
        async with gw.http() as client:
            streamed = {**CHAT, "stream": True}
            answers = [await client.post("/v1/chat/completions", json=b) for b in (streamed, CHAT)]
            refused = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": -1})
            denied = await client.get("/admin/usage/requests", params={"key": "any"})
        async with gw.http(ADMIN_KEY) as admin:

            async def keys() -> list[dict[str, Any]]:
                answer = await admin.get("/admin/usage", params={"by": "tenant,key"})
                return [row for row in answer.json()["rows"] if row["tenant"] == "acme"]

            await wait_until(lambda: _async_true(keys))
            [row] = await keys()
            listed = await admin.get("/admin/usage/requests", params={"key": row["key"]})
            page = await admin.get(
                "/admin/usage/requests", params={"key": row["key"], "limit": "1"}
            )
            bad = [
                await admin.get("/admin/usage/requests", params=params)
                for params in ({}, {"key": row["key"], "limit": "0"}, {"key": "k", "limit": "x"})
            ]
    assert denied.status_code == 403
    records = listed.json()["data"]
    # Oldest first, each as recorded: its id, tokens, status, and a time to first token
    # when it had one (a stream; an answer sent whole has no first token of its own).
    assert [r["request_id"] for r in records] == [
        *(a.headers["x-request-id"] for a in answers),
        refused.headers["x-request-id"],
    ]
    assert [r["status"] for r in records] == [200, 200, 400]
    assert [(r["prompt_tokens"], r["cached_tokens"]) for r in records[:2]] == [(1000, 400)] * 2
    assert records[0]["ttft_ms"] >= 0
    assert records[1]["ttft_ms"] is None and records[2]["ttft_ms"] is None
    assert [r["request_id"] for r in page.json()["data"]] == [records[0]["request_id"]]
    assert [answer.status_code for answer in bad] == [400, 400, 400]
    assert KEYS["acme"] not in listed.text


async def _async_true(probe: Callable[[], Any]) -> bool:
    return bool(await probe())
