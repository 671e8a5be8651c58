"""Fair share and priority in time: served tokens and queue waits on a real Triton model.

tests/e2e/test_admission.py proves the order the gateway dispatches in (shares split the
work, an idle share is lent and reclaimed, online goes before batch) on an upstream the
test paces. This measures what that order gives on a real, busy model: one slot of
llm-small (1 ms a token, triton-sim over gRPC); gold (share 3, short prompts) and iron
(share 1, long prompts) each keep 6 requests going for 3 s, then gold alone for 1.5 s,
then both again; then an online and a batch tenant, 6 requests each, for 3 s. It prints
the served tokens gold:iron while both were busy (3 is the shares' ratio), iron's share
of the tokens in its first second back (0.25 is its share) and the queue waits.

    .venv/bin/python -m loadtest.fair_share
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from gateway.config import hash_key
from gateway_tools.dev.processes import (
    free_port,
    gateway_command,
    spawn,
    start_redis,
    stop,
    wait_gateway_ready,
)
from gateway_tools.dev.sim.server import TritonSim

SHORT = [{"role": "user", "content": "hi"}]
LONG = [{"role": "user", "content": "tell me about " + "the weather " * 30}]
TENANTS: dict[str, dict[str, Any]] = {
    "gold": {"share": 3},
    "iron": {"share": 1},
    "web": {"priority": "online"},
    "bulk": {"priority": "batch"},
}

# (tenant, finish time, total tokens, queue ms) of each answer.
Served = list[tuple[str, float, int, float]]


async def run(
    session: aiohttp.ClientSession, url: str, plan: dict[str, Any], seconds: float, served: Served
) -> None:
    """Each tenant of `plan` keeps 6 requests going for `seconds`."""
    deadline = time.monotonic() + seconds

    async def worker(who: str, messages: list[dict[str, str]]) -> None:
        body = {"model": "fair", "messages": messages, "max_tokens": 20}
        headers = {"authorization": f"Bearer sk-bench-{who}"}
        while time.monotonic() < deadline:
            async with session.post(f"{url}/v1/chat/completions", json=body, headers=headers) as r:
                answer = await r.json()
                assert r.status == 200, answer
                queued = float(r.headers["x-gateway-queue-ms"])
            served.append((who, time.monotonic(), answer["usage"]["total_tokens"], queued))

    await asyncio.gather(*(worker(w, m) for w, m in plan.items() for _ in range(6)))


def tokens(served: Served, start: float, end: float) -> dict[str, int]:
    totals: dict[str, int] = defaultdict(int)
    for who, at, count, _ in served:
        if start <= at < end:
            totals[who] += count
    return totals


async def measure(url: str) -> None:
    served: Served = []
    async with aiohttp.ClientSession() as session:
        both = {"gold": SHORT, "iron": LONG}
        t0 = time.monotonic()
        await run(session, url, both, 3.0, served)
        await run(session, url, {"gold": SHORT}, 1.5, served)
        t2 = time.monotonic()
        await run(session, url, both, 2.0, served)
        # Only what finished while everyone was still sending: the steady state.
        steady = tokens(served, t0 + 0.5, t0 + 3.0)
        print(f"served tokens gold:iron = {steady['gold'] / steady['iron']:.2f} (shares: 3)")
        back = tokens(served, t2, t2 + 1.0)
        share = back["iron"] / (back["iron"] + back["gold"])
        print(f"iron's share of the tokens in its first second back: {share:.2f} (share: 0.25)")
        served.clear()
        await run(session, url, {"web": SHORT, "bulk": SHORT}, 3.0, served)
    for who, name in (("web", "online"), ("bulk", "batch")):
        waits = sorted(q for w, _, _, q in served if w == who)
        p95 = waits[int(0.95 * (len(waits) - 1))]
        print(f"{name}: {len(waits)} served, queue wait median "
              f"{statistics.median(waits):.0f} ms, p95 {p95:.0f} ms")  # fmt: skip


def main() -> None:
    directory = Path(tempfile.mkdtemp(prefix="fair-share-"))
    sim = TritonSim(free_port(span=3, start=27000), "llm-small=1")
    redis_port, port = free_port(start=25000), free_port(span=2, start=26000)
    redis = start_redis(redis_port)
    sim.start()
    gateway = None
    try:
        sim.wait_ready(timeout=90)
        tenants = {
            name: {"api_keys": [hash_key(f"sk-bench-{name}")], "models": ["*"], **settings}
            for name, settings in TENANTS.items()
        }
        (directory / "tenants.yaml").write_text(yaml.safe_dump({"tenants": tenants}))
        fair = {
            "backend": "triton_grpc",
            "replicas": [{"url": sim.grpc_target}],
            "upstream_model": "llm-small",
            "queue": {"max_queued": 512, "max_in_flight_per_replica": 1},
        }
        config = {
            "redis": {"url": f"redis://127.0.0.1:{redis_port}/0"},
            "server": {"ops": {"port": port + 1}},
            "models": {"fair": fair},
        }
        (directory / "gateway.yaml").write_text(yaml.safe_dump(config))
        command = gateway_command(
            "serve", "--config", str(directory / "gateway.yaml"),
            "--host", "127.0.0.1", "--port", str(port),
        )  # fmt: skip
        gateway = spawn(command, log=directory / "gateway.log")
        url = f"http://127.0.0.1:{port}"
        wait_gateway_ready(url, 60, gateway)
        asyncio.run(measure(url))
    finally:
        if gateway is not None:
            stop(gateway)
        sim.stop()
        stop(redis)


if __name__ == "__main__":
    main()
