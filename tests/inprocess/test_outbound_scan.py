"""A large request to a model outside the cluster is scanned for sensitive data off the
event loop, and masked all the same (the hostile review of issue 40: 900 KB of digits
held the loop, and every other tenant's requests, for 1.8 s)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import gateway.serving.conductor
from tests.inprocess.conftest import started_gateway

SECRET = "sk-live-abcdef1234567890abcdef"


def relay_external(config: dict[str, Any]) -> None:
    config["models"]["relay"]["external"] = True
    config["models"]["relay"]["outbound"] = "mask"


@pytest.mark.parametrize("padding", [100, 40_000], ids=["small", "large"])
async def test_a_request_to_an_external_model_is_masked_the_large_one_off_the_loop(
    config_for: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, padding: int
) -> None:
    threads: list[str] = []
    to_thread = asyncio.to_thread

    async def counted(function: Callable[..., Any], *args: Any) -> Any:
        threads.append(getattr(function, "func", function).__name__)
        return await to_thread(function, *args)

    monkeypatch.setattr(gateway.serving.conductor.asyncio, "to_thread", counted)
    async with started_gateway(config_for(edit=relay_external), monkeypatch) as gw:
        text = "word " * (padding // 5) + f"the key is {SECRET}"
        async with gw.http() as client:
            answer = await client.post(
                "/v1/chat/completions",
                json={"model": "relay", "messages": [{"role": "user", "content": text}]},
            )
        assert answer.status_code == 200, answer.text
        [sent] = gw.upstream.calls_to("relayed-model")
    assert SECRET not in str(sent.call)
    # Scanned in a thread only when large: the small one is not worth a thread's hop.
    assert threads == (["prepare"] if padding > 16 * 1024 else [])
