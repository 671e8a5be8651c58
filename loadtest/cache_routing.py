"""Cache-aware against least-load replica choice: time to first token on prefix-cached LLMs.

    python -m loadtest.cache_routing [--seconds 40] [--replicas 4] [--gateways 1,3]
        [--loads 0.5,0.8] [--policies least_load,cache_aware] [--capacity RPS]
        [--load-factor F] [--out /tmp/cache-routing.json] [--write-docs]
        [--workload-name chat] [workload flags: --tenants --system-bytes --turns
        --user-bytes --assistant-bytes --active --one-off-share]

docs/benchmarks.md gives the commands of its two workloads, `chat` (the defaults) and
`agentic`.

Starts `--replicas` Triton servers (triton-sim), each one replica of the simulated LLM
`llm-chat` with a prefix cache and one prefill slot (prompts are computed one at a time,
in turn, for `--prefill-per-char` seconds per byte not cached), and a redis-server on a
free port. The workload (loadtest/cache_workload.py) is multi-turn conversations of
several tenants, each with its long system prompt, plus one-off prompts that share
nothing; conversation requests carry their session key as `prompt_cache_key`.

1. Capacity (unless `--capacity`): the saturation throughput of each policy behind one
   gateway, measured by a closed loop of 4 x replicas workers replaying the workload
   sequence (a warmup, then `--calibrate-seconds`): completed requests per second.
   least_load's is the capacity the loads are fractions of; the two compare throughput.
2. For each gateway count, load (a fraction of the capacity) and policy: fresh gateway
   processes (`gateway serve`, one worker each, the same config, the policy in the
   model's `routing` section, one shared Redis, emptied between runs), then open-loop
   Poisson arrivals at that rate for `--seconds` (the same seed, so the same requests at
   the same times for every policy), each request sent to a gateway picked at random
   (seeded), then a drain until every request has its answer. A conversation's turn is
   sent at its time or once the answer to its previous turn has arrived, if later.

Cold caches: every prompt of a run starts with a salt of the run (`<run 0003>`, a fixed
length so block boundaries do not move) and each session key carries it too, so nothing
cached by an earlier run is ever a hit; the old blocks are only evicted (LRU). The
replicas keep running between runs.

Measured per request: TTFT (from sending to the first SSE chunk with content), end-to-end
latency, status, and the usage the gateway reports. Per run, from the replicas' own
Prometheus metrics (differences before and after the run): the prefix-cache hit rate
(`sim_prefix_cache_hits_total` / `sim_prefix_cache_queries_total`: cached prompt tokens
over prompt tokens in full blocks) and the requests each replica served
(`nv_inference_request_success`), whose max/mean and coefficient of variation are the
load spread. Throughput is the requests answered in full over the time from the run's
start to its last answer.

Prints a Markdown table and the goal checks, writes every request's result to `--out`
(JSON) and, with `--write-docs`, the section between the `cache-routing` markers of
docs/benchmarks.md with a chart of the TTFT distributions
(docs/img/cache-routing-ttft-WORKLOAD.png).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import redis
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import hash_key
from gateway_control.scheduler.queueing.measures import percentile
from gateway_tools.dev.processes import (
    free_port,
    gateway_command,
    spawn,
    start_redis,
    stop,
    wait_gateway_ready,
)
from gateway_tools.dev.sim.repository import ModelProfile
from gateway_tools.dev.sim.server import TritonSim
from loadtest.cache_workload import (
    Message,
    ScheduledRequest,
    WorkloadConfig,
    WorkloadRequest,
    request_stream,
    schedule,
)

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs/benchmarks.md"
HEADING = "## Cache-aware routing: time to first token"


def chart_path(workload: str) -> Path:
    """The TTFT chart of a workload's runs (`--workload-name`)."""
    return ROOT / f"docs/img/cache-routing-ttft-{workload}.png"


def markers(workload: str) -> tuple[str, str]:
    """Where a workload's section of docs/benchmarks.md starts and ends."""
    return f"<!-- cache-routing:{workload}:start -->", f"<!-- cache-routing:{workload}:end -->"


MODEL = "llm-chat"
POLICIES = ("least_load", "cache_aware")
# Port ranges of our own (below Linux's ephemeral range, away from the tests' ranges).
SIM_PORTS = range(21000, 24000)
REDIS_PORTS = range(25000, 26000)
GATEWAY_PORTS = range(26000, 29000)
# No proxies: an http_proxy in the environment must not intercept calls to 127.0.0.1.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class Settings:
    """What a benchmark invocation runs: the cluster, the workload and the client."""

    replicas: int = 4
    token_delay: float = 0.005
    # 100 µs a byte: with this workload a least_load replica computes about 2.4 KB of
    # prompt a request (its system prompts stay cached), so ~4 requests/s a replica; at
    # 20 µs the 4 replicas would take ~80 requests/s, more than 2 cores can stream.
    prefill_per_char: float = 0.0001
    max_tokens: int = 24
    # cache_aware's bound (`routing.load_factor`); the gateway's default.
    load_factor: float = 1.25
    seed: int = 1
    seconds: float = 40.0
    calibrate_seconds: float = 20.0
    warmup_seconds: float = 5.0
    request_timeout_s: float = 180.0
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)

    @property
    def profile(self) -> ModelProfile:
        return ModelProfile(
            MODEL,
            token_delay=self.token_delay,
            prefill_per_char=self.prefill_per_char,
            prefill_slots=1,
        )


@dataclass
class Result:
    """One request's outcome; times in seconds, `sent_s` from the start of its run."""

    index: int
    tenant: str
    conversation: str | None
    turn: int
    prompt_bytes: int
    gateway: int
    scheduled_s: float
    sent_s: float = 0.0
    status: int = 0
    ttft_s: float | None = None
    e2e_s: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None and self.ttft_s is not None

    @property
    def finished_s(self) -> float:
        return self.sent_s + (self.e2e_s or 0.0)


@dataclass(frozen=True)
class ReplicaCounters:
    """Cumulative counters of one replica's Triton metrics for the model."""

    requests: float
    hits: float
    queries: float

    def __sub__(self, other: ReplicaCounters) -> ReplicaCounters:
        return ReplicaCounters(
            self.requests - other.requests, self.hits - other.hits, self.queries - other.queries
        )


@dataclass
class Summary:
    """One run's figures (times in milliseconds)."""

    gateways: int
    load: float
    policy: str
    rate: float
    requests: int
    errors: int
    throughput: float
    ttft_ms: dict[str, float]
    e2e_ms: dict[str, float]
    hit_rate: float | None
    # From the gateway's usage (`prompt_tokens_details.cached_tokens`), when it reports it.
    usage_hit_rate: float | None
    replica_requests: list[float]
    spread_max_mean: float | None
    spread_cv: float | None
    max_send_lag_ms: float


@dataclass
class Run:
    summary: Summary
    results: list[Result]


# ---------------------------------------------------------------------------- processes


def port_in(ports: range, index: int, slots: int, span: int = 1) -> int:
    """A free port in the `index`-th of `slots` equal parts of `ports`: processes that
    start at once never pick the same one."""
    width = len(ports) // slots
    start = ports.start + index * width
    return free_port(span=span, start=start, end=start + width)


def start_sims(settings: Settings) -> list[TritonSim]:
    """The replicas, started together (they load in parallel) and ready."""
    sims: list[TritonSim] = []
    try:
        for i in range(settings.replicas):
            sim = TritonSim(port_in(SIM_PORTS, i, settings.replicas, span=3), [settings.profile])
            sims.append(sim)
            sim.start()
        for sim in sims:
            sim.wait_ready(timeout=120)
    except BaseException:
        for sim in sims:
            sim.stop()
        raise
    return sims


def api_key(tenant: str) -> str:
    return f"sk-cache-{tenant}"


def tenants_config(names: Sequence[str]) -> dict[str, Any]:
    """One tenant per workload tenant, with limits that never refuse."""
    limits = {
        "requests_per_minute": 100_000_000,
        "tokens_per_minute": 10_000_000_000,
        "max_concurrent": 100_000,
    }
    return {
        name: {
            "api_keys": [hash_key(api_key(name))],
            "priority": "online",
            "models": ["*"],
            "limits": limits,
        }
        for name in names
    }


def gateway_config(
    sims: Sequence[TritonSim], redis_url: str, policy: str, settings: Settings
) -> dict[str, Any]:
    """gateway.yaml: the model on every replica with `policy`; admission that never
    refuses at these loads, generous timeouts, health checks as in the e2e tests."""
    return {
        "redis": {"url": redis_url},
        "models": {
            MODEL: {
                "backend": "triton_http",
                "replicas": [{"url": sim.http_url} for sim in sims],
                "max_tokens_default": settings.max_tokens,
                "health": {"interval_s": 0.5, "timeout_s": 1.0},
                "queue": {"max_queued": 100_000, "max_in_flight_per_replica": 10_000},
                "timeouts": {
                    "first_token_s": settings.request_timeout_s,
                    "total_s": settings.request_timeout_s,
                },
                "routing": {"policy": policy, "load_factor": settings.load_factor},
            }
        },
    }


@dataclass
class GatewayProcess:
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    @property
    def chat_url(self) -> str:
        return f"{self.url}/v1/chat/completions"


def start_gateways(
    count: int, directory: Path, config: dict[str, Any], tenants: dict[str, Any]
) -> list[GatewayProcess]:
    """`count` gateway processes (one worker each) serving the same config files."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tenants.yaml").write_text(yaml.safe_dump({"tenants": tenants}))
    (directory / "gateway.yaml").write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if k != "GATEWAY_REDIS_URL"}
    env["GATEWAY_LOG_LEVEL"] = "WARNING"  # no access line a request: CPU is scarce
    gateways: list[GatewayProcess] = []
    try:
        for i in range(count):
            port = port_in(GATEWAY_PORTS, i, count)
            command = gateway_command(
                "serve", "--config", str(directory / "gateway.yaml"), "--host", "127.0.0.1",
                "--port", str(port), "--workers", "1",
            )  # fmt: skip
            log = directory / f"gateway-{i}.log"
            gateways.append(
                GatewayProcess(spawn(command, env=env, log=log), f"http://127.0.0.1:{port}", log)
            )
        for gateway in gateways:
            try:
                wait_gateway_ready(gateway.url, timeout_s=60, process=gateway.process)
            except Exception as exc:
                raise RuntimeError(f"gateway did not start:\n{gateway.log.read_text()}") from exc
    except BaseException:
        stop_gateways(gateways)
        raise
    return gateways


def stop_gateways(gateways: Sequence[GatewayProcess]) -> None:
    for gateway in gateways:
        stop(gateway.process)


@contextlib.contextmanager
def running_gateways(
    count: int, directory: Path, config: dict[str, Any], tenants: dict[str, Any]
) -> Iterator[list[GatewayProcess]]:
    gateways = start_gateways(count, directory, config, tenants)
    try:
        yield gateways
    finally:
        stop_gateways(gateways)


def scrape(url: str) -> str:
    with _HTTP.open(url, timeout=5) as response:
        return str(response.read().decode())


def replica_counters(sim: TritonSim) -> ReplicaCounters:
    """The replica's request count and prefix-cache counters for the model."""
    values = {
        "nv_inference_request_success": 0.0,
        "sim_prefix_cache_hits": 0.0,
        "sim_prefix_cache_queries": 0.0,
    }
    for family in text_string_to_metric_families(scrape(sim.metrics_url)):
        for sample in family.samples:
            # The parser names every counter's samples `<family>_total`.
            name = sample.name.removesuffix("_total")
            if name in values and sample.labels.get("model") == MODEL:
                values[name] += sample.value
    return ReplicaCounters(
        values["nv_inference_request_success"],
        values["sim_prefix_cache_hits"],
        values["sim_prefix_cache_queries"],
    )


# ---------------------------------------------------------------------------- requests


def salt(run: int) -> str:
    """The run's prefix of every prompt: a fixed length, so block boundaries stay put."""
    return f"<run {run:04d}>"


def request_body(request: WorkloadRequest, run: int, settings: Settings) -> bytes:
    """The chat request: streamed with usage, the run's salt at the very start of the
    prompt, and the session key (with the run in it) for a conversation."""
    messages = [{"role": m.role, "content": m.content} for m in request.messages]
    messages[0]["content"] = f"{salt(run)} {messages[0]['content']}"
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": settings.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if request.conversation is not None:
        body["prompt_cache_key"] = f"{request.conversation}@{run:04d}"
    return orjson.dumps(body)


def new_result(request: WorkloadRequest, gateway: int, scheduled_s: float) -> Result:
    return Result(
        index=request.index,
        tenant=request.tenant,
        conversation=request.conversation,
        turn=request.turn,
        prompt_bytes=request.prompt_bytes,
        gateway=gateway,
        scheduled_s=scheduled_s,
    )


async def send(
    session: aiohttp.ClientSession, url: str, key: str, body: bytes, result: Result, origin: float
) -> Result:
    """POST one streamed chat request and fill in `result` (times from `origin`)."""
    loop = asyncio.get_running_loop()
    sent = loop.time()
    result.sent_s = sent - origin
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    done = False
    try:
        async with session.post(url, data=body, headers=headers) as response:
            result.status = response.status
            if response.status != 200:
                result.error = (await response.text())[:300]
                return result
            async for line in response.content:
                if not line.startswith(b"data: "):
                    continue
                data = line[6:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                event = orjson.loads(data)
                if "error" in event:
                    result.error = str(event["error"])[:300]
                    break
                if result.ttft_s is None and any(
                    (choice.get("delta") or {}).get("content") for choice in event["choices"]
                ):
                    result.ttft_s = loop.time() - sent
                if event.get("usage"):
                    read_usage(event["usage"], result)
            if result.error is None and not done:
                result.error = "the stream ended without [DONE]"
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        result.e2e_s = loop.time() - sent
    if result.error is None and result.ttft_s is None:
        result.error = "no content"
    return result


def read_usage(usage: dict[str, Any], result: Result) -> None:
    result.prompt_tokens = usage.get("prompt_tokens")
    details = usage.get("prompt_tokens_details") or {}
    result.cached_tokens = details.get("cached_tokens")


def client_session(settings: Settings) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),
        timeout=aiohttp.ClientTimeout(total=settings.request_timeout_s),
    )


async def open_loop(
    plan: Sequence[ScheduledRequest],
    targets: Sequence[str],
    choices: Sequence[int],
    run: int,
    settings: Settings,
) -> list[Result]:
    """Send each request at its time, to gateway `choices[i]`, without waiting for the
    earlier ones, except that a conversation's turn goes only once the answer to its
    previous turn has arrived (a person, or an agent, reads the answer before going on);
    then wait until every one has its answer."""
    loop = asyncio.get_running_loop()
    async with client_session(settings) as session:
        origin = loop.time()
        tasks = []
        # Each conversation's latest turn sent, which its next turn waits for.
        latest: dict[str, asyncio.Task[Result]] = {}
        for i, item in enumerate(plan):
            delay = origin + item.at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            body = request_body(item.request, run, settings)
            result = new_result(item.request, choices[i], item.at)
            key = api_key(item.request.tenant)
            request = send(session, targets[choices[i]], key, body, result, origin)
            conversation = item.request.conversation
            if conversation is not None and conversation in latest:
                request = after(latest[conversation], request)
            task = asyncio.create_task(request)
            if conversation is not None:
                latest[conversation] = task
            tasks.append(task)
        return list(await asyncio.gather(*tasks))


async def after(previous: asyncio.Task[Result], request: Coroutine[Any, Any, Result]) -> Result:
    """`request`, once `previous` has ended."""
    await asyncio.wait([previous])
    return await request


async def closed_loop(
    url: str, workers: int, warmup_s: float, seconds: float, run: int, settings: Settings
) -> tuple[float, list[Result]]:
    """Saturation throughput: `workers` clients each sending the workload sequence's next
    request as soon as their last is answered. Requests answered in full within the
    `seconds` after the warmup, per second."""
    loop = asyncio.get_running_loop()
    requests = request_stream(settings.seed, settings.workload)
    results: list[Result] = []
    async with client_session(settings) as session:
        origin = loop.time()
        end = origin + warmup_s + seconds

        # Each conversation's latest turn, ended or not: its next turn waits for it.
        answered: dict[str, asyncio.Event] = {}

        async def worker() -> None:
            while loop.time() < end:
                request = next(requests)
                done = asyncio.Event()
                if request.conversation is not None:
                    previous = answered.get(request.conversation)
                    answered[request.conversation] = done
                    if previous is not None:
                        await previous.wait()
                result = new_result(request, 0, loop.time() - origin)
                body = request_body(request, run, settings)
                try:
                    results.append(
                        await send(session, url, api_key(request.tenant), body, result, origin)
                    )
                finally:
                    done.set()

        await asyncio.gather(*(worker() for _ in range(workers)))
    counted = [r for r in results if r.ok and warmup_s <= r.finished_s < warmup_s + seconds]
    return len(counted) / seconds, results


async def warm_up(targets: Sequence[str], count: int, run: int, settings: Settings) -> None:
    """A few short requests through every gateway (connections, first calls), salted
    apart from the run so that they never make a hit in it."""
    async with client_session(settings) as session:
        tenant = settings.workload.tenant_names()[0]
        sends = []
        for i in range(count):
            request = WorkloadRequest(-1 - i, tenant, (Message("user", f"warm up {i}"),))
            body = request_body(request, run, settings)
            result = new_result(request, i % len(targets), 0.0)
            sends.append(
                send(session, targets[i % len(targets)], api_key(tenant), body, result, 0.0)
            )
        failed = [r for r in await asyncio.gather(*sends) if not r.ok]
        if failed:
            raise RuntimeError(f"warm-up requests failed: {failed[0].status} {failed[0].error}")


# ---------------------------------------------------------------------------- runs


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """p50, p95 and p99 of `values` (seconds) in ms; NaN for none."""
    return {f"p{q}": 1000 * percentile(values, q) for q in (50, 95, 99)}


def summarize(
    results: Sequence[Result],
    counters: Sequence[ReplicaCounters],
    gateways: int,
    load: float,
    policy: str,
    rate: float,
) -> Summary:
    ok = [r for r in results if r.ok]
    makespan = max((r.finished_s for r in ok), default=0.0)
    queries = sum(c.queries for c in counters)
    per_replica = [c.requests for c in counters]
    mean = statistics.fmean(per_replica) if per_replica else 0.0
    usage = [r for r in ok if r.prompt_tokens and r.cached_tokens is not None]
    usage_prompt = sum(r.prompt_tokens or 0 for r in usage)
    return Summary(
        gateways=gateways,
        load=load,
        policy=policy,
        rate=rate,
        requests=len(results),
        errors=len(results) - len(ok),
        throughput=len(ok) / makespan if makespan else 0.0,
        ttft_ms=percentiles([r.ttft_s for r in ok if r.ttft_s is not None]),
        e2e_ms=percentiles([r.e2e_s for r in ok if r.e2e_s is not None]),
        hit_rate=sum(c.hits for c in counters) / queries if queries else None,
        usage_hit_rate=(
            sum(r.cached_tokens or 0 for r in usage) / usage_prompt if usage_prompt else None
        ),
        replica_requests=per_replica,
        spread_max_mean=max(per_replica) / mean if mean else None,
        spread_cv=statistics.pstdev(per_replica) / mean if mean else None,
        # Of requests that wait for nothing but their time: a later turn waits for the
        # answer to the one before by design.
        max_send_lag_ms=1000
        * max((r.sent_s - r.scheduled_s for r in results if r.turn <= 1), default=0.0),
    )


@dataclass
class Bench:
    """The running cluster and what every run shares."""

    settings: Settings
    sims: list[TritonSim]
    redis_port: int
    workdir: Path
    runs: int = 0

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    def next_run(self) -> int:
        self.runs += 1
        return self.runs

    def fresh_gateways(
        self, count: int, policy: str, run: int
    ) -> contextlib.AbstractContextManager[list[GatewayProcess]]:
        """Gateways for one run, on an emptied Redis (ours, on its own port)."""
        redis.Redis(host="127.0.0.1", port=self.redis_port).flushall()
        config = gateway_config(self.sims, self.redis_url, policy, self.settings)
        tenants = tenants_config(self.settings.workload.tenant_names())
        return running_gateways(count, self.workdir / f"run-{run:04d}", config, tenants)

    def counters(self) -> list[ReplicaCounters]:
        return [replica_counters(sim) for sim in self.sims]


def calibrate(bench: Bench, policy: str) -> tuple[float, list[Result]]:
    """The cluster's saturation throughput under `policy`, behind one gateway: least_load's
    is the capacity that loads are fractions of; cache_aware's says whether it serves
    no fewer requests at the limit."""
    settings = bench.settings
    run = bench.next_run()
    with bench.fresh_gateways(1, policy, run) as gateways:
        workers = 4 * settings.replicas
        capacity, results = asyncio.run(
            closed_loop(
                gateways[0].chat_url,
                workers,
                settings.warmup_seconds,
                settings.calibrate_seconds,
                run,
                settings,
            )
        )
    errors = sum(not r.ok for r in results)
    print(
        f"saturated {policy}: {capacity:.2f} requests/s ({workers} closed-loop workers, "
        f"{len(results)} requests, {errors} errors)",
        flush=True,
    )
    return capacity, results


def gateway_choices(seed: int, gateways: int, count: int) -> list[int]:
    """The gateway of each request, at random as behind a Kubernetes Service (seeded)."""
    rng = random.Random(f"{seed}:gateways:{gateways}")
    return [rng.randrange(gateways) for _ in range(count)]


def run_once(bench: Bench, gateways: int, load: float, policy: str, capacity: float) -> Run:
    settings = bench.settings
    rate = load * capacity
    plan = schedule(settings.seed, rate, settings.seconds, settings.workload)
    choices = gateway_choices(settings.seed, gateways, len(plan))
    run = bench.next_run()
    with bench.fresh_gateways(gateways, policy, run) as processes:
        targets = [g.chat_url for g in processes]
        asyncio.run(warm_up(targets, 2 * settings.replicas, run + 5000, settings))
        time.sleep(0.5)
        before = bench.counters()
        results = asyncio.run(open_loop(plan, targets, choices, run, settings))
        time.sleep(1.0)  # the replicas' counters of the last requests
        after = bench.counters()
    counters = [a - b for a, b in zip(after, before, strict=True)]
    summary = summarize(results, counters, gateways, load, policy, rate)
    print(row(summary), flush=True)
    if summary.max_send_lag_ms > 100:
        print(f"  (the client sent up to {summary.max_send_lag_ms:.0f} ms late: CPU-bound)")
    return Run(summary, results)


# ---------------------------------------------------------------------------- report

TABLE_HEAD = (
    "| gateways | load | policy | req/s offered | requests | errors | throughput req/s "
    "| TTFT p50 ms | TTFT p95 ms | TTFT p99 ms | e2e p50 ms | e2e p95 ms | e2e p99 ms "
    "| cache hit rate | spread max/mean | spread CV |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def _num(value: float | None, digits: int = 0, suffix: str = "") -> str:
    if value is None or value != value:  # None or NaN
        return "n/a"
    return f"{value:.{digits}f}{suffix}"


def row(s: Summary) -> str:
    hit = None if s.hit_rate is None else 100 * s.hit_rate
    return (
        f"| {s.gateways} | {s.load:.0%} | {s.policy} | {s.rate:.1f} | {s.requests} | {s.errors} "
        f"| {s.throughput:.2f} | {_num(s.ttft_ms['p50'])} | {_num(s.ttft_ms['p95'])} "
        f"| {_num(s.ttft_ms['p99'])} | {_num(s.e2e_ms['p50'])} | {_num(s.e2e_ms['p95'])} "
        f"| {_num(s.e2e_ms['p99'])} | {_num(hit, 1, '%')} | {_num(s.spread_max_mean, 2)} "
        f"| {_num(s.spread_cv, 2)} |"
    )


def table(summaries: Sequence[Summary]) -> str:
    return "\n".join([TABLE_HEAD, *(row(s) for s in summaries)])


def _find(summaries: Sequence[Summary], gateways: int, load: float, policy: str) -> Summary | None:
    for s in summaries:
        if s.gateways == gateways and s.load == load and s.policy == policy:
            return s
    return None


def goal_checks(summaries: Sequence[Summary], saturated: Mapping[str, float]) -> list[str]:
    """The goals at the highest load run (80% by default), met or missed.

    Throughput is compared at saturation (`saturated`, closed loop): in an open-loop run
    both policies serve what arrives as long as the cluster keeps up, so their open-loop
    throughputs differ only by when the last answers land.
    """
    if not summaries:
        return []
    load = max(s.load for s in summaries)
    lines: list[str] = []

    def check(ok: bool, text: str) -> None:
        lines.append(f"- {'met' if ok else 'MISSED'}: {text}")

    if "least_load" in saturated and "cache_aware" in saturated:
        least_rps, aware_rps = saturated["least_load"], saturated["cache_aware"]
        check(
            aware_rps >= least_rps,
            f"saturated, 1 gateway: cache_aware / least_load throughput >= 1: "
            f"{aware_rps:.2f} / {least_rps:.2f} requests/s = {aware_rps / least_rps:.2f}",
        )
    errors = sum(s.errors for s in summaries)
    check(errors == 0, f"every request of every run answered in full: {errors} errors")

    for count in sorted({s.gateways for s in summaries}):
        least = _find(summaries, count, load, "least_load")
        aware = _find(summaries, count, load, "cache_aware")
        where = f"at {load:.0%} load, {count} gateway{'s' if count > 1 else ''}"
        if least is None or aware is None:
            lines.append(f"- n/a: {where}: both policies are needed for the comparison")
            continue
        speedup = least.ttft_ms["p50"] / aware.ttft_ms["p50"]
        p99 = aware.ttft_ms["p99"] / least.ttft_ms["p99"]
        check(speedup >= 2, f"{where}: cache_aware TTFT p50 speedup >= 2x: {speedup:.2f}x")
        check(p99 <= 1, f"{where}: cache_aware / least_load TTFT p99 <= 1: {p99:.2f}")
    one = _find(summaries, 1, load, "cache_aware")
    three = _find(summaries, 3, load, "cache_aware")
    if one is not None and three is not None and one.hit_rate and three.hit_rate is not None:
        ratio = three.hit_rate / one.hit_rate
        check(
            ratio >= 0.9,
            f"at {load:.0%} load: cache_aware hit rate, 3 gateways / 1 gateway >= 0.9: "
            f"{three.hit_rate:.1%} / {one.hit_rate:.1%} = {ratio:.2f}",
        )
    else:
        lines.append("- n/a: hit rate with 3 gateways against 1 needs cache_aware runs of both")
    return lines


def draw_chart(runs: Sequence[Run], path: Path) -> bool:
    """CDFs of TTFT at the highest load, one panel per gateway count; False if no runs."""
    if not runs:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    load = max(r.summary.load for r in runs)
    chosen = [r for r in runs if r.summary.load == load]
    counts = sorted({r.summary.gateways for r in chosen})
    fig, axes = plt.subplots(
        1, len(counts), figsize=(5.5 * len(counts), 3.8), sharey=True, squeeze=False
    )
    for ax, count in zip(axes[0], counts, strict=True):
        for r in chosen:
            if r.summary.gateways != count:
                continue
            ttfts = sorted(1000 * x.ttft_s for x in r.results if x.ok and x.ttft_s is not None)
            shares = [(i + 1) / len(ttfts) for i in range(len(ttfts))]
            ax.step(ttfts, shares, where="post", label=r.summary.policy)
        ax.set_xscale("log")
        # Ticks at 1, 2 and 5 of each decade, written plainly (20, 50, 100, ...).
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("time to first token (ms, log scale)")
        plural = "s" if count > 1 else ""
        ax.set_title(f"{count} gateway{plural}, {load:.0%} of capacity")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="lower right")
    axes[0][0].set_ylabel("share of requests (CDF)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def parameters_text(settings: Settings, capacity: float, saturated: Mapping[str, float]) -> str:
    w = settings.workload
    how = (
        f"measured: least_load behind 1 gateway, {4 * settings.replicas} closed-loop "
        f"workers, {settings.warmup_seconds:g} s warmup then {settings.calibrate_seconds:g} s; "
        + ", ".join(f"{p} saturates at {v:.2f} requests/s" for p, v in saturated.items())
        if saturated
        else "given with --capacity"
    )
    return "\n".join(
        [
            f"- Cluster: {settings.replicas} Triton servers (triton-sim), one replica each of "
            f"`{MODEL}`: {1000 * settings.token_delay:g} ms a token, prefill "
            f"{1e6 * settings.prefill_per_char:g} µs a prompt byte not cached, one prompt at a "
            "time per replica (prefill_slots 1); prefix cache of 4,096 blocks of 16 tokens "
            "(64 bytes) per replica.",
            f"- Workload (seed {settings.seed}): {w.tenants} tenants with a "
            f"{w.system_bytes / 1024:g} KB system prompt each; conversations of "
            f"{w.turns[0]}-{w.turns[1]} turns ({w.user_bytes[0]}-{w.user_bytes[1]} B user, "
            f"{w.assistant_bytes[0]}-{w.assistant_bytes[1]} B assistant messages), "
            f"{w.active} in progress, each turn's session key in `prompt_cache_key`; "
            f"{w.one_off_share:.0%} one-off prompts of {w.one_off_bytes[0] // 1024}-"
            f"{w.one_off_bytes[1] // 1024} KB with no shared prefix. Open-loop Poisson "
            f"arrivals for {settings.seconds:g} s, the same sequence for both policies; "
            f"streamed, max_tokens {settings.max_tokens}.",
            f"- Capacity: {capacity:.2f} requests/s ({how}); the loads are fractions of it.",
            "- Cold caches: every prompt of a run starts with a salt of the run, so no block "
            "cached by an earlier run is a hit. Gateways are started afresh for each run, on "
            "an emptied Redis; with several gateways each request goes to one at random.",
            "- Hit rate: cached prompt tokens / prompt tokens in full blocks, from the "
            "replicas' `sim_prefix_cache_*` metrics; spread: requests per replica "
            "(`nv_inference_request_success`), max/mean and coefficient of variation. "
            "Throughput: requests answered in full / time from the run's start to the last "
            "answer (open loop: what arrived, while the cluster keeps up); compared at "
            "saturation in the goal checks.",
        ]
    )


def docs_section(
    command: str,
    settings: Settings,
    capacity: float,
    saturated: Mapping[str, float],
    summaries: Sequence[Summary],
    chart: Path | None,
) -> str:
    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} with `{command}`; {os.cpu_count()} cores, "
        f"Python {sys.version.split()[0]}. The replicas, Redis, the gateways and the load "
        "generator share the machine's cores.",
        "",
        parameters_text(settings, capacity, saturated),
        "",
        table(summaries),
        "",
        *goal_checks(summaries, saturated),
    ]
    if chart is not None:
        lines += ["", f"![TTFT distributions](img/{chart.name})"]
    return "\n".join(lines)


def write_docs(path: Path, section: str, workload: str) -> None:
    """Replace the text between the workload's markers, or append them with it."""
    text = path.read_text()
    start, end = markers(workload)
    if start in text and end in text:
        before, _, rest = text.partition(start)
        _, _, after = rest.partition(end)
        path.write_text(f"{before}{start}\n{section}\n{end}{after}")
    else:
        path.write_text(f"{text.rstrip()}\n\n{HEADING}\n\n{start}\n{section}\n{end}\n")


def write_json(
    path: Path,
    settings: Settings,
    capacity: float,
    calibration: Sequence[Result],
    runs: Sequence[Run],
) -> None:
    data = {
        "settings": dataclasses.asdict(settings),
        "capacity": capacity,
        "calibration": [dataclasses.asdict(r) for r in calibration],
        "runs": [
            {
                "summary": dataclasses.asdict(r.summary),
                "requests": [dataclasses.asdict(x) for x in r.results],
            }
            for r in runs
        ],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))


# ---------------------------------------------------------------------------- main


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def _floats(text: str) -> list[float]:
    return [float(part) for part in text.split(",") if part.strip()]


def _policies(text: str) -> list[str]:
    policies = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown policies {unknown}: choose from {POLICIES}")
    return policies


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.cache_routing",
        description=__doc__.split("\n")[0] if __doc__ else None,
    )
    parser.add_argument("--seconds", type=float, default=40.0, help="arrivals per run")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--gateways", type=_ints, default=[1, 3], help="e.g. 1,3")
    parser.add_argument("--loads", type=_floats, default=[0.5, 0.8], help="of the capacity")
    parser.add_argument("--policies", type=_policies, default=list(POLICIES))
    parser.add_argument("--capacity", type=float, help="requests/s: skip the calibration")
    parser.add_argument("--calibrate-seconds", type=float, default=20.0)
    parser.add_argument("--warmup-seconds", type=float, default=5.0)
    parser.add_argument("--token-delay", type=float, default=0.005, help="seconds a token")
    parser.add_argument(
        "--prefill-per-char", type=float, default=0.0001, help="seconds a prompt byte"
    )
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--load-factor", type=float, default=1.25, help="cache_aware's bound")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tenants", type=int, default=6)
    parser.add_argument("--active", type=int, default=40, help="conversations in progress")
    parser.add_argument("--one-off-share", type=float, default=0.2)
    parser.add_argument("--turns", type=_ints, default=[3, 8], help="MIN,MAX a conversation")
    parser.add_argument("--system-bytes", type=int, default=4096, help="each tenant's")
    parser.add_argument("--user-bytes", type=_ints, default=[100, 500], help="MIN,MAX")
    parser.add_argument("--assistant-bytes", type=_ints, default=[500, 1200], help="MIN,MAX")
    parser.add_argument("--out", type=Path, default=Path("/tmp/cache-routing.json"))
    parser.add_argument("--write-docs", action="store_true", help=f"update {DOCS.name}")
    parser.add_argument(
        "--workload-name", default="chat", help="names the docs section and chart it writes"
    )
    args = parser.parse_args(argv)
    if args.replicas < 1 or not args.gateways or min(args.gateways) < 1:
        parser.error("--replicas and --gateways must be >= 1")
    if args.capacity is not None and args.capacity <= 0:
        parser.error("--capacity must be > 0")
    return args


def settings_from(args: argparse.Namespace) -> Settings:
    return Settings(
        replicas=args.replicas,
        token_delay=args.token_delay,
        prefill_per_char=args.prefill_per_char,
        max_tokens=args.max_tokens,
        load_factor=args.load_factor,
        seed=args.seed,
        seconds=args.seconds,
        calibrate_seconds=args.calibrate_seconds,
        warmup_seconds=args.warmup_seconds,
        workload=WorkloadConfig(
            tenants=args.tenants,
            active=args.active,
            one_off_share=args.one_off_share,
            turns=(args.turns[0], args.turns[1]),
            system_bytes=args.system_bytes,
            user_bytes=(args.user_bytes[0], args.user_bytes[1]),
            assistant_bytes=(args.assistant_bytes[0], args.assistant_bytes[1]),
        ),
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    settings = settings_from(args)
    command = " ".join(["python -m loadtest.cache_routing", *(argv or sys.argv[1:])])
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="cache-routing-"))
    print(
        f"starting {settings.replicas} replicas and redis-server (logs under {workdir})", flush=True
    )
    sims = start_sims(settings)
    redis_process = None
    runs: list[Run] = []
    calibration: list[Result] = []
    saturated: dict[str, float] = {}
    try:
        redis_port = port_in(REDIS_PORTS, 0, 1)
        redis_process = start_redis(redis_port)
        bench = Bench(settings, sims, redis_port, workdir)
        capacity = args.capacity
        if capacity is None:
            for policy in sorted(args.policies, key=POLICIES.index):
                saturated[policy], results = calibrate(bench, policy)
                calibration += results
            capacity = saturated.get("least_load") or max(saturated.values())
        print(TABLE_HEAD, flush=True)
        for gateways in args.gateways:
            for load in args.loads:
                for policy in args.policies:
                    runs.append(run_once(bench, gateways, load, policy, capacity))
    finally:
        if redis_process is not None:
            stop(redis_process)
        for sim in sims:
            sim.stop()
    summaries = [r.summary for r in runs]
    print()
    print(table(summaries))
    print()
    print("\n".join(goal_checks(summaries, saturated)))
    write_json(args.out, settings, capacity, calibration, runs)
    print(f"\nper-request results: {args.out}")
    if args.write_docs:
        chart_file = chart_path(args.workload_name)
        chart = draw_chart(runs, chart_file)
        section = docs_section(
            command, settings, capacity, saturated, summaries, chart_file if chart else None
        )
        write_docs(DOCS, section, args.workload_name)
        print(f"wrote {DOCS}" + (f" and {chart_file}" if chart else ""))
    print(f"took {time.monotonic() - started:.0f} s")
    errors = sum(s.errors for s in summaries)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
