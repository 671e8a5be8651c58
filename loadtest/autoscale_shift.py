"""The shifting-demand benchmark: static placement against the closed loop, live.

    .venv/bin/python -m loadtest.autoscale_shift [--seed 0] [--plot docs/img/autoscale_shift.png]

Four real tritonserver nodes of `gateway triton-sim` (both models in each repository,
20 tokens at 50 ms: a request holds its slot about 1 s), a redis-server and `gateway
serve` with loadtest/autoscale-config/ (four requests at once per replica: what one
simulated GPU is good for). The trace is `gateway simulate autoscale`'s (the same seed,
the same arrivals): demand moves from one model to the other, the lower priority spikes,
then quiet. Each policy gets a gateway of its own and the whole trace, one after the
other in one run: first static (cluster.yaml's `replicas`, no `autoscale`), then the loop.

Each request is a streamed chat completion from its tenant (acme: llm-large, priority
10; globex: llm-small, priority 0). Per policy it reports the share of requests whose
first token came within the target (1 s), goodput, refusals (an error status with
Retry-After), requests lost (any other failure, or a stream cut short), GPU-seconds
(each node's loaded models, read from its repository index every second) and replica
changes, and charts demand and replicas over time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx
import yaml

from gateway_control.placement.autoscale_cli import format_table, write_chart
from gateway_control.placement.autoscale_sim import SHIFTING, PolicyResult, Sample, Workload
from gateway_tools.dev.processes import (
    free_port,
    gateway_command,
    spawn,
    start_redis,
    stop,
    wait_gateway_ready,
)
from gateway_tools.dev.sim.server import TritonSim

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "loadtest" / "autoscale-config"
MODELS = "llm-large=50,llm-small=50"  # 50 ms a token on both
KEYS = {"llm-large": "sk-shift-acme", "llm-small": "sk-shift-globex"}
MAX_TOKENS = 20
SAMPLE_S = 1.0


@dataclass
class Outcome:
    """What became of one request."""

    model: str
    sent_at: float
    status: int = 0
    ttft_s: float | None = None
    finished: bool = False
    refused: bool = False
    error: str = ""


@dataclass
class Fleet:
    """The nodes' loaded models, sampled."""

    samples: list[tuple[float, dict[str, int]]] = field(default_factory=list)


async def one_request(
    client: httpx.AsyncClient, url: str, model: str, started: float, outcome: Outcome
) -> None:
    """Send one streamed chat completion and note its first token and its end."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Tell me about GPUs."}],
        "max_tokens": MAX_TOKENS,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {KEYS[model]}"}
    sent = time.monotonic()
    try:
        async with client.stream(
            "POST", f"{url}/v1/chat/completions", json=body, headers=headers
        ) as r:
            outcome.status = r.status_code
            if r.status_code != 200:
                await r.aread()
                outcome.refused = "retry-after" in r.headers and r.status_code in (429, 503)
                outcome.error = "" if outcome.refused else f"{r.status_code}: {r.text[:200]}"
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    outcome.finished = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    outcome.error = str(chunk["error"])[:200]
                    break
                choices = chunk.get("choices") or []
                if outcome.ttft_s is None and choices and choices[0]["delta"].get("content"):
                    outcome.ttft_s = time.monotonic() - sent
    except httpx.HTTPError as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"
    if not outcome.finished and not outcome.error:
        outcome.error = "stream ended without [DONE]"


async def sample_fleet(
    nodes: list[TritonSim], fleet: Fleet, started: float, stop_at: float
) -> None:
    """Every second, which models each node has loaded (READY in its repository index)."""
    async with httpx.AsyncClient(timeout=2.0) as client:
        while time.monotonic() < stop_at:
            counts: Counter[str] = Counter()
            for node in nodes:
                try:
                    index = (await client.post(f"{node.http_url}/v2/repository/index")).json()
                except (httpx.HTTPError, ValueError):
                    continue
                counts.update(m["name"] for m in index if m.get("state") == "READY")
            fleet.samples.append((time.monotonic() - started, dict(counts)))
            await asyncio.sleep(SAMPLE_S)


async def drive(
    url: str, workload: Workload, nodes: list[TritonSim]
) -> tuple[list[Outcome], Fleet]:
    """Send every arrival of the trace at its time; sample the fleet meanwhile."""
    arrivals = workload.arrivals()
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=200)
    fleet = Fleet()
    outcomes: list[Outcome] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(90.0), limits=limits) as client:
        started = time.monotonic()
        sampler = asyncio.create_task(
            sample_fleet(nodes, fleet, started, started + workload.seconds + 30)
        )
        tasks = []
        for at, model in arrivals:
            delay = started + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            outcome = Outcome(model, at)
            outcomes.append(outcome)
            tasks.append(asyncio.create_task(one_request(client, url, model, started, outcome)))
        await asyncio.gather(*tasks)
        sampler.cancel()
    return outcomes, fleet


def cluster_file(tmp: Path, loop: bool, nodes: list[TritonSim]) -> Path:
    """The benchmark's cluster.yaml, with the loop or without (`replicas` fixed)."""
    cluster = yaml.safe_load((CONFIG / "cluster.yaml").read_text())
    for i, node in enumerate(cluster["nodes"]):
        node["url"] = nodes[i].http_url
    if not loop:
        for deployment in cluster["deployments"]:
            deployment.pop("autoscale", None)
    path = tmp / ("cluster-loop.yaml" if loop else "cluster-static.yaml")
    path.write_text(yaml.safe_dump(cluster))
    return path


def result_of(
    policy: str, workload: Workload, outcomes: list[Outcome], fleet: Fleet, interval: float
) -> PolicyResult:
    """The figures of one policy's run, in the simulator's shape (for one table)."""
    targets = {name: p.ttft_target_s for name, p in workload.profiles.items()}
    result = PolicyResult(policy, seconds=workload.seconds)
    result.requests = len(outcomes)
    result.within_slo = sum(
        1 for o in outcomes if o.finished and o.ttft_s is not None and o.ttft_s <= targets[o.model]
    )
    result.refused = sum(1 for o in outcomes if o.refused)
    result.lost = sum(1 for o in outcomes if o.error)
    in_trace = [(t, c) for t, c in fleet.samples if t <= workload.seconds]
    result.gpu_seconds = sum(sum(c.values()) for _, c in in_trace) * SAMPLE_S
    previous: dict[str, int] | None = None
    for _, counts in in_trace:
        if previous is not None:
            result.replica_changes += sum(
                abs(counts.get(m, 0) - previous.get(m, 0)) for m in set(counts) | set(previous)
            )
        previous = counts
    models = sorted(workload.profiles)
    t = interval
    while t <= workload.seconds + 1e-9:
        arrived = Counter(o.model for o in outcomes if t - interval <= o.sent_at < t)
        ready = next((c for s, c in in_trace if s >= t), in_trace[-1][1] if in_trace else {})
        result.timeline.append(
            Sample(
                t,
                {m: arrived[m] / interval for m in models},
                {m: ready.get(m, 0) for m in models},
                float(sum(ready.values())),
            )
        )
        t += interval
    return result


def run_policy_live(
    loop: bool, workload: Workload, nodes: list[TritonSim], redis_url: str, tmp: Path
) -> tuple[PolicyResult, list[Outcome]]:
    """One gateway with this policy, the whole trace through it."""
    port = free_port(span=2, start=18400, end=18900)
    env = {
        **os.environ,
        "GATEWAY_PORT": str(port),
        "GATEWAY_OPS_PORT": str(port + 1),
        "GATEWAY_REDIS_URL": redis_url,
        "SHIFT_CLUSTER_FILE": str(cluster_file(tmp, loop, nodes)),
    }
    log = tmp / f"gateway-{'loop' if loop else 'static'}.log"
    command = gateway_command("serve", "--config", str(CONFIG / "gateway.yaml"))
    process = spawn(command, env=env, log=log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_gateway_ready(url, 120, process)
        wait_placed(nodes, {"llm-large": 2, "llm-small": 2})
        outcomes, fleet = asyncio.run(drive(url, workload, nodes))
    finally:
        stop(process)
    interval = float(
        yaml.safe_load((CONFIG / "cluster.yaml").read_text())["autoscaling"]["interval_s"]
    )
    policy = "closed loop" if loop else "static"
    return result_of(policy, workload, outcomes, fleet, interval), outcomes


def wait_placed(nodes: list[TritonSim], wanted: dict[str, int], timeout_s: float = 120) -> None:
    """Until the nodes have loaded `wanted` replicas of each model (and no more)."""
    deadline = time.monotonic() + timeout_s
    while True:
        counts: Counter[str] = Counter()
        for node in nodes:
            index = httpx.post(f"{node.http_url}/v2/repository/index", timeout=5).json()
            counts.update(m["name"] for m in index if m.get("state") == "READY")
        if dict(counts) == wanted:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"placement not reached: {dict(counts)} != {wanted}")
        time.sleep(0.5)


@contextmanager
def shifting_fleet() -> Iterator[tuple[list[TritonSim], str]]:
    """The benchmark's four triton-sim nodes (both models in each repository) and a
    redis-server, ready; stopped at the end whatever happens."""
    redis_port = free_port(start=16500, end=16900)
    redis = start_redis(redis_port)
    # Four nodes of three ports each (HTTP, gRPC, metrics), in one free block.
    base = free_port(span=40, start=24000, end=25000)
    nodes = [TritonSim(base + 10 * i, MODELS) for i in range(4)]
    try:
        for node in nodes:
            node.start()
            node.wait_ready(timeout=120)
        yield nodes, f"redis://127.0.0.1:{redis_port}/0"
    finally:
        for node in nodes:
            node.stop()
        stop(redis)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--time-scale", type=float, default=1.0, help="each phase this many times as long"
    )
    parser.add_argument("--plot", help="chart demand and replicas into this PNG")
    parser.add_argument("--json", help="write the figures and every request's outcome here")
    args = parser.parse_args()
    phases = [replace(p, seconds=p.seconds * args.time_scale) for p in SHIFTING.phases]
    workload = replace(SHIFTING, seed=args.seed, phases=phases)
    tmp = Path(tempfile.mkdtemp(prefix="autoscale-shift-"))
    with shifting_fleet() as (nodes, redis_url):
        results = []
        details = {}
        for loop in (False, True):
            result, outcomes = run_policy_live(loop, workload, nodes, redis_url, tmp)
            results.append(result)
            details[result.policy] = [o.__dict__ for o in outcomes]
            print(format_table([result]), flush=True)
            errors = Counter(o.error[:80] for o in outcomes if o.error)
            if errors:
                print("lost:", dict(errors.most_common(5)), flush=True)
    print(format_table(results))
    print(f"logs: {tmp}")
    if args.plot:
        write_chart(results, args.plot)
    if args.json:
        rows = [r.row() for r in results]
        Path(args.json).write_text(json.dumps({"results": rows, "requests": details}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
