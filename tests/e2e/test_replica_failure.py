"""A replica killed with SIGKILL: the other replica keeps serving, no request hangs."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI, OpenAI

from gateway_tools.dev.sim.server import TritonSim
from tests.e2e.conftest import two_sims_and_gateway
from tests.e2e.stack import KEYS, Gateway, default_tenants, model
from tests.polling import wait_until

PROMPT = [{"role": "user", "content": "keep going"}]


@pytest.fixture
def two_replicas(redis_url: str, tmp_path: Path) -> Iterator[tuple[Gateway, TritonSim, TritonSim]]:
    def models(first: TritonSim, second: TritonSim) -> dict[str, Any]:
        return {
            "victim-http": model(
                "triton_http", [first.http_url, second.http_url], upstream_model="victim"
            ),
            "victim-grpc": model(
                "triton_grpc", [first.grpc_target, second.grpc_target], upstream_model="victim"
            ),
        }

    tenants = default_tenants(["victim-http"])
    with two_sims_and_gateway("victim=20", models, redis_url, tmp_path, tenants) as stack:
        yield stack


def test_requests_are_served_by_the_surviving_replica(
    two_replicas: tuple[Gateway, TritonSim, TritonSim],
) -> None:
    gateway, first, _ = two_replicas
    client = OpenAI(base_url=gateway.base_url, api_key=KEYS["acme"], max_retries=0)
    first.kill()
    # Every request succeeds: those sent to the dead replica move to the live one.
    for model_name in ("victim-http", "victim-grpc"):
        for _ in range(6):
            response = client.chat.completions.create(
                model=model_name, messages=PROMPT, max_tokens=3
            )
            assert len(response.choices[0].message.content.split()) == 3
            streamed = list(
                client.chat.completions.create(
                    model=model_name, messages=PROMPT, max_tokens=3, stream=True
                )
            )
            assert streamed[-1].choices[0].finish_reason == "length"


async def test_streams_on_a_killed_replica_end_with_an_error_event(
    two_replicas: tuple[Gateway, TritonSim, TritonSim],
) -> None:
    gateway, first, _ = two_replicas
    # The timeout only guards against a hang; a correct gateway ends every stream first.
    client = AsyncOpenAI(base_url=gateway.base_url, api_key=KEYS["acme"], max_retries=0, timeout=60)
    started = asyncio.Event()
    outcomes: list[str] = []

    async def one_stream(model_name: str) -> None:
        stream = await client.chat.completions.create(
            model=model_name, messages=PROMPT, max_tokens=200, stream=True
        )
        try:
            async for chunk in stream:
                started.set()
                if chunk.choices and chunk.choices[0].finish_reason:
                    outcomes.append("finished")
        except openai.APIError as exc:
            outcomes.append("error" if "backend" in str(exc) else f"other: {exc}")

    tasks = [
        asyncio.create_task(one_stream(name))
        for name in ("victim-http", "victim-grpc")
        for _ in range(2)
    ]
    await started.wait()
    # Streams of this prompt run about 35 tokens at 20 ms: they are mid-way here.
    await asyncio.sleep(0.2)
    first.kill()
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)
    # Least-outstanding balancing put some of the four streams on the killed replica.
    assert sorted(set(outcomes)) == ["error", "finished"], outcomes
    assert len(outcomes) == 4


async def test_a_model_without_a_replica_leaves_the_instance_ready(
    two_replicas: tuple[Gateway, TritonSim, TritonSim],
) -> None:
    """Every instance shares the replicas: pulling this one for them would pull them all."""
    gateway, first, second = two_replicas
    first.kill()
    second.kill()

    async def readyz() -> tuple[int, dict[str, Any]]:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{gateway.url}/readyz") as response,
        ):
            return response.status, await response.json()

    async def no_replica_left() -> bool:
        _, body = await readyz()
        return all(m["healthy"] == 0 for m in body["models"].values())

    await wait_until(no_replica_left)
    status, body = await readyz()
    assert status == 200
    assert body["ready"] is True
    assert body["status"] == "degraded"
    assert body["models"]["victim-http"] == {"ready": False, "replicas": 2, "healthy": 0}
