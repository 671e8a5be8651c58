"""What the rate limiter costs: Lua decisions/s against Redis's PING ceiling, Redis
commands per admitted request, and the latency the limiter adds through the gateway.

    .venv/bin/python -m loadtest.bench_ratelimit [--seconds 10]

1. `redis-benchmark` on one redis-server: PING, then EVALSHA of take.lua shaped like a
   real admission (a request bucket, a token bucket and a concurrency lease).
2. The gateway's own client path (`RedisBuckets.take`, redis-py asyncio + hiredis) at
   concurrency 1 and 32.
3. `gateway serve` with loadtest/bench-config in front of an instant upstream: wrk with
   the limited key (sk-bench-1234: requests, tokens and concurrency limits) and with the
   unlimited key (no Redis call), interleaved; `INFO commandstats` counts the commands.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import subprocess
import time

from redis import Redis as SyncRedis
from redis.asyncio import Redis

from gateway.ratelimit.buckets import BucketSpec, LeaseSpec, bucket_key
from gateway.ratelimit.redis_store import TAKE_LUA, RedisBuckets
from gateway_tools.dev.processes import free_port, start_redis, stop
from loadtest.stack import bench_stack, scrape_metrics, wrk, wrk_script

BIG = 1e12  # buckets that never refuse: the benchmark measures cost, not refusals


def redis_benchmark(port: int, requests: int, *command: str) -> float:
    """Requests/s that redis-benchmark reports (32 clients, no pipelining)."""
    out = subprocess.run(
        ["redis-benchmark", "-p", str(port), "-c", "32", "-n", str(requests), "-r", "1000000",
         "-q", *command],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    found = re.findall(r"([\d.]+) requests per second", out)
    assert found, out
    return float(found[-1])


def admission(tenant: str) -> tuple[list[BucketSpec], LeaseSpec]:
    specs = [
        BucketSpec(bucket_key("bench", tenant, "requests"), BIG, 1.0, 1),
        BucketSpec(bucket_key("bench", tenant, "tokens"), BIG, 1.0, 300),
    ]
    return specs, LeaseSpec(bucket_key("bench", tenant, "inflight"), "m", 1_000_000, 1000)


async def client_path(port: int, seconds: float, concurrency: int) -> tuple[float, float]:
    """Decisions/s and p50 ms of `RedisBuckets.take` with `concurrency` callers."""
    redis = Redis(port=port)
    store = RedisBuckets(redis)
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def caller(i: int) -> None:
        specs, lease = admission(f"t{i}")
        n = 0
        while time.perf_counter() < deadline:
            # A fresh member per call, as per request in the gateway.
            member = LeaseSpec(lease.key, f"m{n}", lease.limit, lease.ttl_ms)
            started = time.perf_counter()
            await store.take(specs, member)
            latencies.append((time.perf_counter() - started) * 1000)
            n += 1

    started = time.perf_counter()
    await asyncio.gather(*(caller(i) for i in range(concurrency)))
    elapsed = time.perf_counter() - started
    await redis.aclose()
    return len(latencies) / elapsed, statistics.median(latencies)


def round_trips(gateway_url: str) -> float:
    """The gateway's Redis calls so far: admissions plus pipelined settle flushes."""
    text = scrape_metrics(gateway_url)
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("gateway_redis_duration_seconds_count")
    )


def commandstats(port: int) -> dict[str, int]:
    with SyncRedis(port=port) as redis:
        stats = redis.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=int, default=10)
    args = parser.parse_args()

    port = free_port(start=28000)
    redis = start_redis(port)
    try:
        with SyncRedis(port=port) as sync:
            sha = sync.script_load(TAKE_LUA)
        n = 300_000
        ping = redis_benchmark(port, n, "-t", "ping")
        lua = redis_benchmark(
            port, n, "EVALSHA", sha, "3", "bench:{t}:requests", "bench:{t}:tokens",
            "bench:{t}:inflight", "2", str(BIG), "1", "1", str(BIG), "1", "300",
            "m__rand_int__", "1000000000", "1000",
        )  # fmt: skip
        one = asyncio.run(client_path(port, args.seconds, 1))
        many = asyncio.run(client_path(port, args.seconds, 32))
    finally:
        stop(redis)

    print("## Decisions per second on one redis-server\n")
    print("| path | concurrency | per second | p50 ms |")
    print("|---|---|---|---|")
    print(f"| redis-benchmark PING | 32 | {ping:.0f} | |")
    print(f"| redis-benchmark EVALSHA take.lua (2 buckets + lease) | 32 | {lua:.0f} | |")
    print(f"| RedisBuckets.take (redis-py asyncio + hiredis) | 1 | {one[0]:.0f} | {one[1]:.3f} |")
    print(
        f"| RedisBuckets.take (redis-py asyncio + hiredis) | 32 | {many[0]:.0f} | {many[1]:.3f} |"
    )
    print(f"\nLua path / PING ceiling: {lua / ping:.2f}\n")

    limited, unlimited = wrk_script("sk-bench-1234"), wrk_script("sk-bench-unlimited")
    with bench_stack() as stack:
        for script in (limited, unlimited):
            wrk(stack.chat_url, 8, 2, script)
        runs: dict[tuple[str, int], list[dict[str, float]]] = {}
        counted: dict[str, float] = {}
        for connections in (1, 32, 1, 32):
            for name, script in (("limits on", limited), ("no limits", unlimited)):
                before = commandstats(stack.redis_port)
                trips_before = round_trips(stack.gateway_url)
                run = wrk(stack.chat_url, connections, args.seconds, script)
                time.sleep(0.5)  # the settles run after the responses
                after = commandstats(stack.redis_port)
                trips = round_trips(stack.gateway_url) - trips_before
                runs.setdefault((name, connections), []).append(run)
                if name == "limits on" and connections == 32:
                    calls = {k: after.get(k, 0) - before.get(k, 0) for k in after}
                    counted["all"] = sum(calls.values()) / run["requests"]
                    counted["evalsha"] = calls.get("evalsha", 0) / run["requests"]
                    counted["trips"] = trips / run["requests"]

    print("## Through the gateway (--workers 1, instant upstream)\n")
    print("| tenant | concurrency | requests/s | p50 ms | p99 ms |")
    print("|---|---|---|---|---|")
    for (name, connections), results in runs.items():
        med = {k: statistics.median(r[k] for r in results) for k in ("rps", "p50", "p99")}
        print(
            f"| {name} | {connections} | {med['rps']:.0f} | {med['p50']:.2f} | {med['p99']:.2f} |"
        )
    print(
        f"\nAt concurrency 32 with limits on, per admitted request: "
        f"{counted['trips']:.2f} Redis round trips (1 to admit, the settles pipelined), "
        f"{counted['evalsha']:.2f} EVALSHA, and {counted['all']:.1f} commands that Redis "
        "ran, those inside the scripts included"
    )


if __name__ == "__main__":
    main()
