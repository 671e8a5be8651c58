"""Embeddings and streamed tool calls through the gateway, against Triton directly.

    .venv/bin/python -m loadtest.bench_api [--seconds 10] [--rounds 1]

Starts a triton-sim server with an embedding model and an LLM whose time per token and
per input byte is zero (what is left is Triton's and the simulator's own cost), a
redis-server and `gateway serve` with one worker, then runs wrk, interleaved:

- embeddings, batches of 1 and 32 texts: Triton's `infer` directly against the
  gateway's `/v1/embeddings` (base64, as the openai SDK asks), in inputs per second;
- streams of one chat answer: plain text against a Hermes tool call (the gateway reads
  the call out of the text as it streams), in chunks per second (the chunks of one
  answer, counted once, times answers per second).

Prints Markdown tables of medians.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import urllib.request
from pathlib import Path

import yaml

from gateway_tools.dev.processes import (
    free_port,
    gateway_command,
    spawn,
    start_redis,
    stop,
    wait_gateway_ready,
)
from gateway_tools.dev.sim.server import TritonSim
from loadtest.stack import ROOT, cpu_seconds, wrk, wrk_script

KEY = "sk-bench-1234"
TEXT = "The quick brown fox jumps over the lazy dog near the river bank"
# Arguments of several fields, so that a call streams in several pieces.
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "country": {"type": "string"},
                "unit": {"enum": ["C", "F"]},
                "days": {"type": "integer"},
                "hourly": {"type": "boolean"},
                "fields": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["city"],
        },
    },
}


def gateway_config(directory: Path, sim: TritonSim, redis_port: int) -> Path:
    models = {
        "embed": {
            "backend": "triton_http",
            "upstream_model": "embed-small",
            "replicas": [{"url": sim.http_url}],
            "capabilities": {"embeddings": {"dimensions": 256, "max_batch": 32}},
            "queue": {"max_queued": 4096, "max_in_flight_per_replica": 1024},
        },
        "llm": {
            "backend": "triton_http",
            "upstream_model": "llm-small",
            "replicas": [{"url": sim.http_url}],
            "capabilities": {"tools": True, "tool_parser": "hermes"},
            "max_tokens_default": 64,
            "queue": {"max_queued": 4096, "max_in_flight_per_replica": 1024},
        },
    }
    config = {
        "redis": {"url": f"redis://127.0.0.1:{redis_port}/0", "key_prefix": "bench"},
        "tenants_file": "tenants.yaml",
        "models": models,
    }
    shutil.copy(ROOT / "loadtest/bench-config/tenants.yaml", directory / "tenants.yaml")
    path = directory / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def chunks_per_answer(url: str, body: str) -> int:
    request = urllib.request.Request(
        url,
        data=body.encode(),
        headers={"content-type": "application/json", "authorization": f"Bearer {KEY}"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        lines = response.read().decode().splitlines()
    data = [line for line in lines if line.startswith("data: ") and line != "data: [DONE]"]
    return len(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (apt-get install wrk)")
    sim = TritonSim(free_port(span=3, start=27000), "embed-small=0,llm-small=0")
    redis_port = free_port(start=25000)
    redis = start_redis(redis_port)
    directory = Path(tempfile.mkdtemp(prefix="bench-api-"))
    config = gateway_config(directory, sim, redis_port)
    port = free_port(start=26000)
    env = dict(os.environ, GATEWAY_LOG_LEVEL="WARNING")
    command = gateway_command(
        "serve", "--config", str(config), "--host", "127.0.0.1", "--port", str(port)
    )
    with sim:
        gateway = spawn(command, env=env, log=directory / "gateway.log")
        try:
            wait_gateway_ready(f"http://127.0.0.1:{port}", 30, gateway)
            run(args, sim, f"http://127.0.0.1:{port}", gateway.pid)
        finally:
            stop(gateway)
            stop(redis)


def run(args: argparse.Namespace, sim: TritonSim, gateway: str, pid: int) -> None:
    targets: dict[tuple[str, int], tuple[str, str, int]] = {}
    for batch in (1, 32):
        texts = [f"{TEXT} {i}" for i in range(batch)]
        triton = {
            "inputs": [{"name": "text_input", "shape": [batch], "datatype": "BYTES", "data": texts}]
        }
        ours = {"model": "embed", "input": texts, "encoding_format": "base64"}
        url = f"{sim.http_url}/v2/models/embed-small/infer"
        targets[("embeddings: Triton directly", batch)] = (url, json.dumps(triton), batch)
        url = f"{gateway}/v1/embeddings"
        targets[("embeddings: gateway", batch)] = (url, json.dumps(ours), batch)
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    stream = {"model": "llm", "messages": ask, "stream": True, "max_tokens": 64}
    url = f"{gateway}/v1/chat/completions"
    for name, body in (
        ("stream: text", stream),
        ("stream: tool call", {**stream, "tools": [WEATHER]}),
    ):
        text = json.dumps(body)
        targets[(name, 0)] = (url, text, chunks_per_answer(url, text))
    results: dict[tuple[str, int, int], list[dict[str, float]]] = {}
    scripts = {key: wrk_script(KEY, body) for key, (_, body, _) in targets.items()}
    for key, (url, _, _) in targets.items():
        wrk(url, 4, 1, scripts[key])  # warm up
    for _ in range(args.rounds):
        for connections in (1, 16):
            for key, (url, _, _) in targets.items():
                cpu = cpu_seconds(pid)
                result = wrk(url, connections, args.seconds, scripts[key])
                result["cpu_us"] = 1e6 * (cpu_seconds(pid) - cpu) / result["requests"]
                results.setdefault((*key, connections), []).append(result)
    print("| target | batch | c | inputs/s | requests/s | p50 ms | gateway CPU µs/request |")
    print("|---|---|---|---|---|---|---|")
    for (name, batch, connections), runs in results.items():
        if not name.startswith("embeddings"):
            continue
        med = {k: statistics.median(r[k] for r in runs) for k in ("rps", "p50", "cpu_us")}
        cpu = f"{med['cpu_us']:,.0f}" if "gateway" in name else ""
        print(
            f"| {name} | {batch} | {connections} | {med['rps'] * batch:,.0f} | "
            f"{med['rps']:,.0f} | {med['p50']:.2f} | {cpu} |"
        )
    print()
    print("| stream | chunks an answer | c | chunks/s | answers/s | p50 ms | CPU µs/answer |")
    print("|---|---|---|---|---|---|---|")
    for (name, _, connections), runs in results.items():
        if not name.startswith("stream"):
            continue
        chunks = targets[(name, 0)][2]
        med = {k: statistics.median(r[k] for r in runs) for k in ("rps", "p50", "cpu_us")}
        print(
            f"| {name.removeprefix('stream: ')} | {chunks} | {connections} | "
            f"{med['rps'] * chunks:,.0f} | {med['rps']:,.0f} | {med['p50']:.2f} | "
            f"{med['cpu_us']:,.0f} |"
        )


if __name__ == "__main__":
    main()
