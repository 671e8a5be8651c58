"""A client that leaves: what it took from its limits goes back, and it is answered 499."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.inprocess.conftest import KEYS, started_gateway
from tests.polling import wait_until

CHAT = {"model": "llm-large", "messages": [{"role": "user", "content": "Hello"}]}


def one_at_a_time(tenants: dict[str, Any]) -> None:
    tenants["tenants"]["acme"]["limits"] = {"max_concurrent": 1}


async def call(app: Any, body: bytes, leaves: asyncio.Event | None = None) -> int:
    """POST `body` to the chat endpoint over ASGI; the client leaves once `leaves` is
    set (never, if None). The status answered."""
    sent = False
    status = 0
    done = asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        waits = [asyncio.create_task(done.wait())]
        if leaves is not None:
            waits.append(asyncio.create_task(leaves.wait()))
        _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif not message.get("more_body"):
            done.set()

    scope = {
        "type": "http",
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"authorization", f"Bearer {KEYS['acme']}".encode()),
            (b"content-type", b"application/json"),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8080),
        "state": {},
    }
    await app(scope, receive, send)
    return status


async def test_a_client_that_leaves_while_its_admission_is_out_gives_its_slot_back(
    config_for: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The client leaves while the limiter's call to Redis is out: the slot and tokens
    # Redis took must come back (a cancel there would lose the reply, and the slot would
    # stay taken until its lease ran out).
    async with started_gateway(config_for(edit_tenants=one_at_a_time), monkeypatch) as gw:
        limiter = gw.app.app.state.runtime.limiter  # type: ignore[attr-defined]
        admit = limiter.admit
        leaves = asyncio.Event()

        async def admit_as_the_client_leaves(*args: Any, **kwargs: Any) -> Any:
            leaves.set()
            await asyncio.sleep(0)  # the disconnect is heard while the call is out
            return await admit(*args, **kwargs)

        monkeypatch.setattr(limiter, "admit", admit_as_the_client_leaves)
        assert await call(gw.app, orjson.dumps(CHAT), leaves) == 499
        monkeypatch.setattr(limiter, "admit", admit)
        assert gw.upstream.calls_to("llm-large") == []  # it never reached a replica

        async def served() -> bool:
            return await call(gw.app, orjson.dumps(CHAT)) == 200

        # One at a time: the next request gets the slot once the release (sent in the
        # background) has reached Redis, not after the lease's 30 s.
        await wait_until(served, timeout_s=10)


def priced(config: dict[str, Any]) -> None:
    config["prices"] = {
        "currency": "EUR",
        "models": {"llm-large": {"input_per_million": 3.0, "output_per_million": 15.0}},
    }


async def test_a_whole_answer_the_client_left_is_recorded_at_the_model_it_is_charged_at(
    config_for: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that leaves while the replica computes a whole answer is charged its
    prompt and what the replica can have made meanwhile (at least a token, at most its
    `max_tokens`); its usage record says so, at that model (found by the hostile
    review: the record had no model and no tokens, only a cost)."""
    async with started_gateway(config_for(edit=priced), monkeypatch) as gw:
        records = gw.finished_records()
        route = gw.app.app.state.runtime.routes["llm-large"]  # type: ignore[attr-defined]
        leaves = asyncio.Event()

        async def computing(url: str, upstream_call: Any) -> Any:
            leaves.set()
            await asyncio.sleep(30)  # cancelled when the client leaves

        monkeypatch.setattr(route.backend, "complete", computing)
        body = orjson.dumps({**CHAT, "max_tokens": 4000})
        assert await call(gw.app, body, leaves) == 499
    [record] = records
    assert (record.status, record.served_model) == (499, "llm-large")
    assert 1 <= record.completion_tokens < 4000 and record.prompt_tokens > 0
    assert record.cost_micros == record.prompt_tokens * 3 + record.completion_tokens * 15
