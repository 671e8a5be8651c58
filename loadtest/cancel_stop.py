"""How soon a replica stops generating after the gateway's client leaves.

    .venv/bin/python -m loadtest.cancel_stop [--rounds 5]

Starts a triton-sim (`llm-slow`, 40 ms a token), a redis-server and `gateway serve`, with
the model behind each Triton backend (HTTP generate, gRPC stream). For each backend and
each mode (streamed, whole), a client asks for 2,000 tokens and leaves once the replica
has generated a few; the replica's own counter (`sim_generated_tokens_total`) is then
read every 10 ms until it stops growing. Prints, per case, the tokens the replica
generated after the client closed its connection and how long it kept on (median and
maximum over the rounds). A replica that did not stop would go on for 80 s.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson
import yaml

from gateway.config.keys import hash_key
from gateway_tools.dev.processes import (
    free_port,
    gateway_command,
    spawn,
    start_redis,
    stop,
    wait_gateway_ready,
)
from gateway_tools.dev.sim.server import TritonSim

KEY = "sk-cancel-measure"
TOKEN_DELAY_S = 0.04


async def generated(session: aiohttp.ClientSession, sim: TritonSim) -> float:
    async with session.get(sim.metrics_url) as response:
        text = await response.text()
    wanted = 'sim_generated_tokens_total{model="llm-slow"}'
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(wanted))


async def one_round(
    session: aiohttp.ClientSession, sim: TritonSim, gateway_port: int, model: str, stream: bool
) -> tuple[float, float]:
    """(tokens generated after the client left, seconds the replica went on)."""
    body = orjson.dumps(
        {"model": model, "messages": [{"role": "user", "content": "hi"}],
         "max_tokens": 2000, "stream": stream}
    )  # fmt: skip
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"authorization: Bearer {KEY}\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    before = await generated(session, sim)
    _, writer = await asyncio.open_connection("127.0.0.1", gateway_port)
    writer.write(head.encode() + body)
    await writer.drain()
    while True:  # until the replica has generated a few tokens of the answer
        if await generated(session, sim) >= before + 5:
            break
        await asyncio.sleep(0.01)
    at_close = await generated(session, sim)
    closed = time.monotonic()
    writer.close()
    last, last_change = at_close, closed
    # Stopped: unchanged for 25 token delays.
    while time.monotonic() - last_change < 25 * TOKEN_DELAY_S:
        await asyncio.sleep(0.01)
        now = await generated(session, sim)
        if now != last:
            last, last_change = now, time.monotonic()
    return last - at_close, max(0.0, last_change - closed)


async def measure(sim: TritonSim, gateway_port: int, rounds: int) -> list[str]:
    lines = [
        "| backend | mode | tokens after the client left | went on for (s) |",
        "|---|---|---|---|",
    ]
    async with aiohttp.ClientSession() as session:
        for model in ("slow-http", "slow-grpc"):
            for stream in (True, False):
                tokens, seconds = [], []
                for _ in range(rounds):
                    after, went_on = await one_round(session, sim, gateway_port, model, stream)
                    tokens.append(after)
                    seconds.append(went_on)
                lines.append(
                    f"| {model} | {'streamed' if stream else 'whole'} | "
                    f"median {statistics.median(tokens):.0f}, max {max(tokens):.0f} | "
                    f"median {statistics.median(seconds):.3f}, max {max(seconds):.3f} |"
                )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    sim = TritonSim(free_port(span=3, start=28000), f"llm-slow={TOKEN_DELAY_S * 1000:.0f}")
    redis_port = free_port(start=28100)
    port = free_port(span=2, start=28200)
    with tempfile.TemporaryDirectory(prefix="cancel-stop-") as tmp:
        config = Path(tmp)
        models = {
            "slow-http": {"backend": "triton_http", "replicas": [{"url": sim.http_url}],
                          "upstream_model": "llm-slow", "max_tokens_limit": 4096},
            "slow-grpc": {"backend": "triton_grpc", "replicas": [{"url": sim.grpc_target}],
                          "upstream_model": "llm-slow", "max_tokens_limit": 4096},
        }  # fmt: skip
        settings = {
            "redis": {"url": f"redis://127.0.0.1:{redis_port}/0"},
            "models": models,
            "server": {"ops": {"port": port + 1}},
        }
        (config / "gateway.yaml").write_text(yaml.safe_dump(settings))
        tenant = {"api_keys": [hash_key(KEY)], "models": ["*"]}
        (config / "tenants.yaml").write_text(yaml.safe_dump({"tenants": {"measure": tenant}}))
        redis = start_redis(redis_port)
        sim.start()
        gateway = None
        try:
            sim.wait_ready(timeout=120)
            gateway = spawn(
                gateway_command(
                    "serve", "--config", str(config / "gateway.yaml"), "--port", str(port)
                ),
                log=config / "gateway.log",
            )
            try:
                wait_gateway_ready(f"http://127.0.0.1:{port}", 60, gateway)
            except RuntimeError:
                raise SystemExit((config / "gateway.log").read_text()) from None
            lines = asyncio.run(measure(sim, port, args.rounds))
        finally:
            if gateway is not None:
                stop(gateway)
            sim.stop()
            stop(redis)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
