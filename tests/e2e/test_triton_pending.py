"""Non-streaming Triton models: the queue Triton reports counts in routing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway_tools.dev.sim.server import TritonSim
from tests.e2e.conftest import two_sims_and_gateway
from tests.e2e.stack import Gateway, model, tenant
from tests.e2e.test_admission import post


@pytest.fixture
def sync_replicas(redis_url: str, tmp_path: Path) -> Iterator[tuple[Gateway, TritonSim, TritonSim]]:
    def models(first: TritonSim, second: TritonSim) -> dict[str, Any]:
        return {
            "sync": model(
                "triton_http",
                [first.http_url, second.http_url],
                upstream_model="echo-sync",
                queue={"max_in_flight_per_replica": 8},
                health={"interval_s": 0.1, "timeout_s": 1.0},
            )
        }

    # `-sync`: a non-decoupled model, one request at a time, the rest queued in Triton.
    tenants = {"web": tenant("web", ["*"])}
    with two_sims_and_gateway("echo-sync=20", models, redis_url, tmp_path, tenants) as stack:
        yield stack


async def successes(session: aiohttp.ClientSession, sim: TritonSim) -> int:
    async with session.get(sim.metrics_url) as response:
        for line in (await response.text()).splitlines():
            if line.startswith('nv_inference_request_success{model="echo-sync"'):
                return int(float(line.split()[-1]))
    return 0


async def test_requests_avoid_a_replica_busy_with_other_clients(
    sync_replicas: tuple[Gateway, TritonSim, TritonSim],
) -> None:
    gateway, busy, idle = sync_replicas
    async with aiohttp.ClientSession() as session:
        # Another client queues 6 requests (about 1.2 s of work) directly on the first
        # replica; the gateway has nothing in flight anywhere.
        url = f"{busy.http_url}/v2/models/echo-sync/generate"
        direct = [
            asyncio.create_task(session.post(url, json={"text_input": "x", "max_tokens": 10}))
            for _ in range(6)
        ]
        await asyncio.sleep(0.4)  # the gateway scrapes Triton's metrics every 0.1 s
        results = [await post(session, gateway, "web", "sync", max_tokens=2) for _ in range(3)]
        for response in await asyncio.gather(*direct):
            response.release()
        served_busy, served_idle = await successes(session, busy), await successes(session, idle)
    assert [status for status, _, _ in results] == [200, 200, 200]
    # Without Triton's queue in the picture, equal gateway load would send the first
    # request to the first replica.
    assert (served_busy, served_idle) == (6, 3)
