"""The batch benchmark: the shifting online load alone, then with a batch in the gaps.

    .venv/bin/python -m loadtest.batch_shift [--lines 20000] [--plot docs/img/batch_shift.png]
        [--json out.json]

The fleet and the online load are `loadtest/autoscale_shift.py`'s (four real tritonserver
nodes of `gateway triton-sim`, the closed loop on, the same seeded arrivals: demand moves
from one model to the other, spikes, then quiet), run twice, one gateway each: first the
online load alone, then the same arrivals with a batch of `--lines` chat lines (of both
models, 4 tokens each) submitted through the OpenAI SDK at the start.

Reported per run: online SLO attainment (first token within 1 s) and p95 time to first
token; the share of the replicas' slots busy (in flight / ready replicas x 4, sampled
every half second) over the time the batch had work; the batch's lines a second; and a
chart of online and batch work over time.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import yaml
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import hash_key
from gateway_control.placement.autoscale_sim import SHIFTING, Workload
from gateway_tools.dev.processes import (
    free_port,
    gateway_command,
    spawn,
    stop,
    wait_gateway_ready,
)
from gateway_tools.dev.sim.server import TritonSim
from loadtest.autoscale_shift import (
    CONFIG,
    Outcome,
    cluster_file,
    one_request,
    shifting_fleet,
    wait_placed,
)

BATCH_KEY = "sk-shift-batch"
SLOTS_PER_REPLICA = 4
SAMPLE_S = 0.5
TTFT_TARGET_S = 1.0


@dataclass
class Sampled:
    """The fleet every half second: in flight per model, ready replicas per model, the
    online requests the load generator has out, the batch's finished lines."""

    t: float
    in_flight: dict[str, float]
    ready: dict[str, int]
    online: int
    batch_done: int
    batch_open: bool


@dataclass
class Run:
    name: str
    outcomes: list[Outcome] = field(default_factory=list)
    samples: list[Sampled] = field(default_factory=list)
    batch_id: str | None = None


def config_dir(tmp: Path, nodes: list[TritonSim], run: str, reserve: int) -> Path:
    """autoscale-config's gateway.yaml with the ledger and the Batch APIs, and its tenants
    with a third, the batch's owner."""
    out = tmp / run
    out.mkdir()
    gateway = yaml.safe_load((CONFIG / "gateway.yaml").read_text())
    gateway["ledger"] = {"url": f"sqlite:///{out}/usage.db", "spool_dir": str(out / "spool")}
    gateway["batches"] = {"files_dir": str(out / "files"), "reserve_slots": reserve}
    gateway["cluster_file"] = str(cluster_file(out, True, nodes))
    gateway["tenants_file"] = str(out / "tenants.yaml")
    tenants = yaml.safe_load((CONFIG / "tenants.yaml").read_text())
    unlimited = {"requests_per_minute": 10**6, "tokens_per_minute": 10**8, "max_concurrent": 10**4}
    tenants["tenants"]["batchco"] = {
        "api_keys": [hash_key(BATCH_KEY)],
        "models": ["llm-large", "llm-small"],
        "limits": unlimited,
        "batch": {"max_concurrent_lines": 10_000},
    }
    (out / "tenants.yaml").write_text(yaml.safe_dump(tenants))
    (out / "gateway.yaml").write_text(yaml.safe_dump(gateway))
    return out / "gateway.yaml"


def batch_file(lines: int) -> bytes:
    """`lines` chat lines, alternating the two models, 4 tokens each."""
    rows = []
    for i in range(lines):
        body = {
            "model": ("llm-small", "llm-large")[i % 2],
            "max_tokens": 4,
            "messages": [{"role": "user", "content": f"Classify document {i}."}],
        }
        rows.append(
            json.dumps(
                {
                    "custom_id": f"doc-{i}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": body,
                }
            )
        )
    return ("\n".join(rows) + "\n").encode()


async def sample(
    url: str, ops_url: str, nodes: list[TritonSim], run: Run, online: list[int],
    started: float, stop_at: float, online_done: asyncio.Event,
) -> None:  # fmt: skip
    """Sample until the online load is done and the batch (if any) has ended, or `stop_at`."""
    async with httpx.AsyncClient(timeout=2.0) as client:
        while time.monotonic() < stop_at:
            if online_done.is_set() and not (run.samples and run.samples[-1].batch_open):
                return
            at = time.monotonic() - started
            in_flight: dict[str, float] = {}
            try:
                text = (await client.get(f"{ops_url}/metrics")).text
                for family in text_string_to_metric_families(text):
                    for s in family.samples:
                        if s.name == "gateway_admission_in_flight":
                            in_flight[s.labels["model"]] = s.value
            except httpx.HTTPError:
                pass
            ready: Counter[str] = Counter()
            for node in nodes:
                try:
                    index = (await client.post(f"{node.http_url}/v2/repository/index")).json()
                except (httpx.HTTPError, ValueError):
                    continue
                ready.update(m["name"] for m in index if m.get("state") == "READY")
            done, open_ = 0, False
            if run.batch_id is not None:
                try:
                    batch = (
                        await client.get(
                            f"{url}/v1/batches/{run.batch_id}",
                            headers={"Authorization": f"Bearer {BATCH_KEY}"},
                        )
                    ).json()
                    counts = batch["request_counts"]
                    done = counts["completed"] + counts["failed"]
                    open_ = batch["status"] in ("validating", "in_progress", "finalizing")
                except (httpx.HTTPError, ValueError, KeyError):
                    pass
            run.samples.append(Sampled(at, in_flight, dict(ready), online[0], done, open_))
            await asyncio.sleep(SAMPLE_S)


async def drive(
    url: str, ops_url: str, workload: Workload, nodes: list[TritonSim], run: Run,
    batch_lines: int,
) -> None:  # fmt: skip
    arrivals = workload.arrivals()
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=200)
    online = [0]

    async def counted(client: httpx.AsyncClient, model: str, outcome: Outcome) -> None:
        online[0] += 1
        try:
            await one_request(client, url, model, started, outcome)
        finally:
            online[0] -= 1

    async with httpx.AsyncClient(timeout=httpx.Timeout(90.0), limits=limits) as client:
        started = time.monotonic()
        if batch_lines:
            sdk = OpenAI(base_url=f"{url}/v1", api_key=BATCH_KEY, max_retries=2)
            uploaded = await asyncio.to_thread(
                sdk.files.create, file=("docs.jsonl", io.BytesIO(batch_file(batch_lines))),
                purpose="batch",
            )  # fmt: skip
            created = await asyncio.to_thread(
                sdk.batches.create, input_file_id=uploaded.id,
                endpoint="/v1/chat/completions", completion_window="24h",
            )  # fmt: skip
            run.batch_id = created.id
        tail_s = 600 if batch_lines else 0
        online_done = asyncio.Event()
        stop_at = started + workload.seconds + tail_s
        sampler = asyncio.create_task(
            sample(url, ops_url, nodes, run, online, started, stop_at, online_done)
        )
        tasks = []
        for at, model in arrivals:
            delay = started + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            outcome = Outcome(model, at)
            run.outcomes.append(outcome)
            tasks.append(asyncio.create_task(counted(client, model, outcome)))
        await asyncio.gather(*tasks)
        online_done.set()
        await sampler  # until the batch has ended (or the tail ends)


def run_live(
    name: str, workload: Workload, nodes: list[TritonSim], redis_url: str, tmp: Path,
    lines: int, reserve: int = 0,
) -> Run:  # fmt: skip
    port = free_port(span=2, start=18400, end=18900)
    env = {**os.environ, "GATEWAY_PORT": str(port), "GATEWAY_OPS_PORT": str(port + 1),
           "GATEWAY_REDIS_URL": redis_url}  # fmt: skip
    config = config_dir(tmp, nodes, name, reserve)
    process = spawn(gateway_command("serve", "--config", str(config)), env=env,
                    log=config.parent / "gateway.log")  # fmt: skip
    url, ops_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"
    run = Run(name)
    try:
        wait_gateway_ready(url, 120, process)
        wait_placed(nodes, {"llm-large": 2, "llm-small": 2})
        asyncio.run(drive(url, ops_url, workload, nodes, run, lines))
    finally:
        stop(process)
    return run


def figures(run: Run, window: tuple[float, float]) -> dict[str, Any]:
    """A run's figures; the busy share over `window` (the time the batch had work)."""
    ttfts = sorted(o.ttft_s for o in run.outcomes if o.finished and o.ttft_s is not None)
    within = sum(
        1 for o in run.outcomes if o.finished and o.ttft_s is not None and o.ttft_s <= TTFT_TARGET_S
    )
    busy = capacity = 0.0
    for s in run.samples:
        if window[0] <= s.t <= window[1]:
            busy += sum(s.in_flight.values())
            capacity += SLOTS_PER_REPLICA * sum(s.ready.values())
    lost = sum(1 for o in run.outcomes if o.error)
    return {
        "run": run.name,
        "online requests": len(run.outcomes),
        "online SLO attainment %": round(100.0 * within / max(1, len(run.outcomes)), 2),
        "online p95 TTFT s": round(statistics.quantiles(ttfts, n=20)[18], 3) if ttfts else None,
        "online lost": lost,
        "slots busy %": round(100.0 * busy / capacity, 1) if capacity else None,
    }


def batch_window(run: Run) -> tuple[float, float]:
    """From the batch's first sample to the last sample it still had work in."""
    open_ = [s.t for s in run.samples if s.batch_open]
    return (open_[0], open_[-1]) if open_ else (0.0, 0.0)


def write_chart(alone: Run, with_batch: Run, path: str) -> None:
    from gateway_control.scheduler.experiments.plots import pyplot

    plt = pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for run, axis in ((alone, top), (with_batch, bottom)):
        times = [s.t for s in run.samples]
        total = [sum(s.in_flight.values()) for s in run.samples]
        online = [min(s.online, t) for s, t in zip(run.samples, total, strict=True)]
        batch = [t - o for t, o in zip(total, online, strict=True)]
        capacity = [SLOTS_PER_REPLICA * sum(s.ready.values()) for s in run.samples]
        axis.stackplot(times, online, batch, labels=["online in flight", "batch in flight"])
        axis.plot(times, capacity, color="black", label="slots (ready replicas x 4)")
        axis.set_title(run.name)
        axis.set_ylabel("requests")
        axis.legend(loc="upper right", fontsize=8)
    bottom.set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--time-scale", type=float, default=1.0, help="each phase this many times as long"
    )
    parser.add_argument(
        "--reserve", type=int, default=0, help="batches.reserve_slots: slots left to online"
    )
    parser.add_argument("--plot", help="chart online and batch work into this PNG")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    phases = [replace(p, seconds=p.seconds * args.time_scale) for p in SHIFTING.phases]
    workload = replace(SHIFTING, seed=args.seed, phases=phases)
    tmp = Path(tempfile.mkdtemp(prefix="batch-shift-"))
    with shifting_fleet() as (nodes, redis_url):
        alone = run_live("online alone", workload, nodes, redis_url, tmp, 0)
        with_batch = run_live(
            f"online + {args.lines:,}-line batch (reserve_slots {args.reserve})",
            workload, nodes, redis_url, tmp, args.lines, args.reserve,
        )  # fmt: skip
    window = batch_window(with_batch)
    rows = [figures(alone, window), figures(with_batch, window)]
    done = [s for s in with_batch.samples if window[0] <= s.t <= window[1]]
    span = max(1e-9, window[1] - window[0])
    lines_per_s = (done[-1].batch_done - done[0].batch_done) / span if done else 0.0
    rows[1]["batch lines/s"] = round(lines_per_s, 1)
    rows[1]["batch window s"] = round(window[1] - window[0], 1)
    rows[1]["batch lines done"] = done[-1].batch_done if done else 0
    for row in rows:
        print(json.dumps(row))
    print(f"logs: {tmp}")
    if args.plot:
        write_chart(alone, with_batch, args.plot)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "window": window}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
