"""Replicas from DNS under traffic: the gateway follows SRV records that a test changes
while streams run, against real Triton servers, and drops no request (issue 16)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from gateway_tools.dev.processes import stop
from gateway_tools.dev.sim.server import TritonSim
from tests.dns_server import Zone, dns_server
from tests.e2e.stack import KEYS, Gateway, replica_requests, start_gateway, tenant
from tests.polling import wait_until

SERVICE = "_http._tcp.triton-llm-large.example.internal"


@pytest.fixture
def discovered(
    sims: tuple[TritonSim, TritonSim], redis_url: str, tmp_path: Path
) -> Iterator[tuple[Gateway, Zone]]:
    a, _ = sims
    with dns_server() as (nameserver, zone):
        zone.set_a("pod-a.example.internal", ["127.0.0.1"])
        zone.set_a("pod-b.example.internal", ["127.0.0.1"])
        zone.set_srv(SERVICE, [("pod-a.example.internal", a.port)])
        models = {
            "llm-large": {
                "backend": "triton_http",
                "max_tokens_default": 16,
                "health": {"interval_s": 0.5, "timeout_s": 1.0},
                "discovery": {"dns": SERVICE, "record": "SRV", "interval_s": 0.3,
                              "nameservers": [nameserver]},
            }
        }  # fmt: skip
        tenants = {"acme": tenant("acme", ["*"])}
        gateway = start_gateway(tmp_path, models, redis_url, tenants=tenants)
        try:
            yield gateway, zone
        finally:
            stop(gateway.process)


async def stream(session: aiohttp.ClientSession, gateway: Gateway) -> str:
    """One streamed completion: `ok` when it ends with [DONE], else what went wrong."""
    body = {"model": "llm-large", "messages": [{"role": "user", "content": "go"}],
            "max_tokens": 24, "stream": True}  # fmt: skip
    headers = {"Authorization": f"Bearer {KEYS['acme']}"}
    async with session.post(f"{gateway.base_url}/chat/completions", json=body,
                            headers=headers) as response:  # fmt: skip
        text = await response.text()
    if response.status != 200:
        return f"status {response.status}"
    return "ok" if text.rstrip().endswith("data: [DONE]") else "cut"


async def test_the_replica_set_follows_dns_while_streams_run(
    discovered: tuple[Gateway, Zone], sims: tuple[TritonSim, TritonSim]
) -> None:
    gateway, zone = discovered
    a, b = sims
    url_a, url_b = a.http_url, b.http_url
    outcomes: Counter[str] = Counter()
    stop_load = asyncio.Event()
    async with aiohttp.ClientSession() as session:

        async def load() -> None:
            while not stop_load.is_set():
                outcomes[await stream(session, gateway)] += 1

        workers = [asyncio.create_task(load()) for _ in range(4)]

        async def served(url: str) -> float:
            return (await asyncio.to_thread(replica_requests, gateway, "llm-large")).get(url, 0)

        async def a_serves() -> bool:
            return await served(url_a) > 5

        await wait_until(a_serves)
        # A second pod joins: the gateway starts sending it requests.
        zone.set_srv(SERVICE, [("pod-a.example.internal", a.port),
                               ("pod-b.example.internal", b.port)])  # fmt: skip

        async def b_serves() -> bool:
            return await served(url_b) > 5

        await wait_until(b_serves)
        # The first pod leaves: its streams finish there, no new one starts there.
        zone.set_srv(SERVICE, [("pod-b.example.internal", b.port)])

        async def only_b() -> bool:
            replicas = await asyncio.to_thread(lambda: gateway.log)
            return f"replicas from DNS {SERVICE}: {url_b} (were {url_a}, {url_b})" in replicas

        await wait_until(only_b)
        await asyncio.sleep(0.5)  # what A had in flight ends
        a_after_removal = await served(url_a)
        await asyncio.sleep(1.5)
        stop_load.set()
        await asyncio.gather(*workers)
        a_at_end, b_at_end = await served(url_a), await served(url_b)
    assert set(outcomes) == {"ok"}, outcomes
    assert a_at_end == a_after_removal  # nothing new went to the pod that left
    assert b_at_end > 10
    print(f"DNS discovery under traffic: {outcomes['ok']} streams, all complete")
