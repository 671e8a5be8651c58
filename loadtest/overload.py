"""Overload with a replica killed: what every request got.

    .venv/bin/python -m loadtest.overload [--seconds 15] [--clients 48]

Two real Triton servers (triton-sim): llm-large (20 ms a token) on both, llm-small
(2 ms a token) on the first; a redis-server; the gateway with llm-large on 2 replicas x
4 slots, a queue of 16, and llm-small as its fallback (ttft_timeout 1 s, predicted_wait).
Clients (half online, half batch, one of them rate-limited) stream chat requests with a
deadline of 3 s. The second replica is SIGKILLed a third of the way in. Prints the count
of each outcome; nothing may hang (each client has a 30 s guard).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

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

TENANTS = {
    "web": {"priority": "online"},
    "bulk": {"priority": "batch"},
    "capped": {"priority": "online", "limits": {"requests_per_minute": 60}},
}


def write_config(
    directory: Path, a: TritonSim, b: TritonSim, redis_port: int, ops_port: int
) -> Path:
    gateway = {
        "server": {"ops": {"port": ops_port}},
        "redis": {"url": f"redis://127.0.0.1:{redis_port}/0"},
        "models": {
            "llm-large": {
                "backend": "triton_http",
                "replicas": [{"url": a.http_url}, {"url": b.http_url}],
                "queue": {"max_queued": 16, "max_in_flight_per_replica": 4},
                "timeouts": {"first_token_s": 1.0, "total_s": 30},
                "fallback": ["llm-small"],
                "health": {"interval_s": 0.5},
            },
            "llm-small": {
                "backend": "triton_grpc",
                "replicas": [{"url": a.grpc_target}],
                "queue": {"max_queued": 64, "max_in_flight_per_replica": 16},
            },
        },
    }
    tenants = {
        name: {"api_keys": [hash_key(f"sk-load-{name}")], **settings}
        for name, settings in TENANTS.items()
    }
    (directory / "tenants.yaml").write_text(yaml.safe_dump({"tenants": tenants}))
    path = directory / "gateway.yaml"
    path.write_text(yaml.safe_dump(gateway))
    return path


async def client(
    session: aiohttp.ClientSession,
    url: str,
    who: str,
    until: float,
    killed: asyncio.Event,
    outcomes: Counter[tuple[str, str]],
) -> None:
    body = {
        "model": "llm-large",
        "messages": [{"role": "user", "content": "write a long poem"}],
        "max_tokens": 30,
        "stream": True,
    }
    headers = {"authorization": f"Bearer sk-load-{who}", "x-request-timeout": "3"}
    while time.monotonic() < until:
        # The phase the request started in: before or after the replica was killed.
        phase = "after" if killed.is_set() else "before"
        async with session.post(url, json=body, headers=headers) as response:
            text = await response.text()
            if response.status != 200:
                retry = (
                    "with Retry-After" if "Retry-After" in response.headers else "no Retry-After"
                )
                outcomes[(f"{response.status} {retry}", phase)] += 1
                await asyncio.sleep(0.2)
                continue
            fallback = response.headers.get("x-gateway-fallback")
            if '"error"' in text:
                code = _error_code(text)
                outcomes[(f"200 stream ended by an error event ({code})", phase)] += 1
            elif text.rstrip().endswith("data: [DONE]"):
                outcomes["200 complete" + (" (fallback)" if fallback else ""), phase] += 1
            else:
                outcomes[("200 cut short", phase)] += 1


def _error_code(text: str) -> str:
    """The `code` of the SSE error event that ended a stream."""
    for line in text.splitlines():
        if line.startswith("data: {") and '"error"' in line:
            error = json.loads(line.removeprefix("data: ")).get("error", {})
            return str(error.get("code"))
    return "?"


async def load(url: str, seconds: float, clients: int, kill: TritonSim) -> Counter[tuple[str, str]]:
    """(outcome, phase) counts; phase is when the request started, before or after the
    kill. A request that started before and ended after counts as before."""
    outcomes: Counter[tuple[str, str]] = Counter()
    until = time.monotonic() + seconds
    timeout = aiohttp.ClientTimeout(total=30)
    killed = asyncio.Event()
    async with aiohttp.ClientSession(timeout=timeout) as session:
        whos = ["web", "bulk"] * (clients // 2 - 1) + ["capped", "capped"]
        tasks = [
            asyncio.create_task(client(session, url, who, until, killed, outcomes)) for who in whos
        ]
        await asyncio.sleep(seconds / 3)
        kill.kill()
        killed.set()
        await asyncio.gather(*tasks)
    return outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--clients", type=int, default=48)
    args = parser.parse_args()
    a = TritonSim(free_port(span=3, start=30000), "llm-large=20,llm-small=2")
    b = TritonSim(free_port(span=3, start=31000), "llm-large=20")
    redis = start_redis(free_port(start=25000))
    gateway = None
    try:
        for sim in (a, b):
            sim.start()
        for sim in (a, b):
            sim.wait_ready(90)
        port = free_port(span=2, start=26000)
        redis_port = int(redis.args[2])  # type: ignore[index]
        config = write_config(Path(tempfile.mkdtemp()), a, b, redis_port, ops_port=port + 1)
        gateway = spawn(gateway_command("serve", "--config", str(config), "--port", str(port)))
        wait_gateway_ready(f"http://127.0.0.1:{port}", 30, gateway)
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        outcomes = asyncio.run(load(url, args.seconds, args.clients, b))
        exposition = scrape(f"http://127.0.0.1:{port + 1}/metrics")
        fallbacks = [
            line for line in exposition.splitlines() if line.startswith("gateway_fallbacks_total")
        ]
    finally:
        if gateway is not None:
            stop(gateway)
        a.stop()
        b.stop()
        stop(redis)
    print("| outcome | started before the kill | started after | all |\n|---|---|---|---|")
    for outcome in sorted({outcome for outcome, _ in outcomes}):
        before, after = outcomes[(outcome, "before")], outcomes[(outcome, "after")]
        print(f"| {outcome} | {before} | {after} | {before + after} |")
    print("\n" + "\n".join(fallbacks))


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


if __name__ == "__main__":
    main()
