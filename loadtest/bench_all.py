"""The benchmark suite: the upstream directly against the gateway with everything on.

    loadtest/bench [--seconds 10] [--rounds 1] [--write docs/benchmarks.md]

Starts an instant OpenAI upstream (nginx: a fixed answer, and on the next port a fixed
20-chunk SSE stream), a redis-server, and `gateway serve` twice with
loadtest/bench-config (limits, admission, metrics, logs on), at `--workers 1` and
`--workers 2`. wrk then measures requests/s and p50/p99 at concurrency 1, 32 and 128 for
each target, the targets interleaved, and the streaming case (chunks relayed per second)
at concurrency 32. Prints a Markdown table with the ratios and, with `--write`, puts it
into that file between the `bench:start` and `bench:end` markers.

`--baseline DIR` also runs the gateway of another source tree (a `git worktree` of an
earlier commit) at `--workers 1`, with this venv, interleaved with the others: the one
way to compare two versions on a machine whose speed drifts.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from gateway.dev.processes import (
    free_port,
    gateway_command,
    spawn,
    start_redis,
    stop,
    wait_gateway_ready,
    wait_http_ok,
)
from loadtest.instant_upstream import STREAM_CHUNKS, start_nginx
from loadtest.stack import (
    BENCH_CONFIG,
    STREAM_BODY,
    cpu_seconds,
    scrape_metrics,
    wrk,
    wrk_script,
)

START, END = "<!-- bench:start -->", "<!-- bench:end -->"


def versions() -> str:
    import aiohttp
    import redis
    import starlette
    import uvicorn

    wrk_version = subprocess.run(["wrk", "-v"], capture_output=True, text=True).stdout
    return (
        f"Python {platform.python_version()}, starlette {starlette.__version__}, "
        f"uvicorn {uvicorn.__version__}, aiohttp {aiohttp.__version__}, "
        f"redis-py {redis.__version__}, {wrk_version.split(' [')[0].strip()}, "
        f"{os.cpu_count()} cores"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--write", type=Path, help="the Markdown file to update")
    parser.add_argument("--baseline", type=Path, help="another source tree to compare with")
    args = parser.parse_args()
    for tool in ("wrk", "nginx"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            raise SystemExit(f"{tool} is not installed (apt-get install wrk nginx-light)")

    upstream_port = free_port(span=2, start=24000)
    nginx, _ = start_nginx(upstream_port)
    redis = start_redis(free_port(start=25000))
    env = dict(os.environ)
    env["BENCH_UPSTREAM_URL"] = f"http://127.0.0.1:{upstream_port}"
    env["BENCH_STREAM_UPSTREAM_URL"] = f"http://127.0.0.1:{upstream_port + 1}"
    env["BENCH_REDIS_URL"] = f"redis://127.0.0.1:{redis.args[2]}/0"  # type: ignore[index]
    gateways: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    to_start = [("gateway", 1), ("gateway", 2)]
    if args.baseline is not None:
        to_start.append(("baseline gateway", 1))
    try:
        for index, (name, workers) in enumerate(to_start):
            port = free_port(start=26000 + 1000 * index)
            command = gateway_command(
                "serve", "--config", str(BENCH_CONFIG), "--host", "127.0.0.1",
                "--port", str(port), "--workers", str(workers),
            )  # fmt: skip
            own_env = env
            if name == "baseline gateway":
                # The other tree's package first; the working directory not on the path.
                own_env = {**env, "PYTHONPATH": str(args.baseline.resolve()), "PYTHONSAFEPATH": "1"}
            # Logs on, as in production, into a file rather than the terminal.
            log = Path(tempfile.mkdtemp(prefix="bench-")) / f"gateway-{index}.log"
            label = f"{name} --workers {workers}"
            gateways[label] = (spawn(command, env=own_env, log=log), port)
        wait_http_ok(f"http://127.0.0.1:{upstream_port}/v1/models", 10, nginx)
        for label, (process, port) in gateways.items():
            if label.startswith("baseline"):
                # An older gateway's /readyz may lack `status`; its 200 meant all up.
                wait_http_ok(f"http://127.0.0.1:{port}/readyz", 60, process)
            else:
                wait_gateway_ready(f"http://127.0.0.1:{port}", 60, process)
        rows = run(args, upstream_port, {n: (p.pid, port) for n, (p, port) in gateways.items()})
    finally:
        for process, _ in gateways.values():
            stop(process)
        stop(redis)
        stop(nginx)
    table = render(rows, args)
    print(table)
    if args.write is not None:
        text = args.write.read_text()
        before, _, rest = text.partition(START)
        _, _, after = rest.partition(END)
        args.write.write_text(f"{before}{START}\n{table}\n{END}{after}")


def redis_totals(base_url: str) -> tuple[float, float]:
    """Round trips the gateway's limiter made to Redis, and script calls they carried."""
    text = scrape_metrics(base_url)
    totals = {
        "gateway_redis_duration_seconds_count": 0.0,
        "gateway_redis_calls_per_round_trip_sum": 0.0,
    }
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in totals:
                totals[sample.name] += sample.value
    return totals["gateway_redis_duration_seconds_count"], totals[
        "gateway_redis_calls_per_round_trip_sum"
    ]


def measure(
    url: str, connections: int, seconds: int, script: Path, gateway: tuple[int, str] | None
) -> dict[str, float]:
    """One wrk run; for a gateway, also its CPU and Redis round trips per request."""
    if gateway is None:
        return wrk(url, connections, seconds, script)
    pid, base_url = gateway
    cpu, (trips, calls) = cpu_seconds(pid), redis_totals(base_url)
    result = wrk(url, connections, seconds, script)
    after_trips, after_calls = redis_totals(base_url)
    requests = max(result["requests"], 1.0)
    result["cpu_us"] = 1e6 * (cpu_seconds(pid) - cpu) / requests
    result["round_trips"] = (after_trips - trips) / requests
    result["script_calls"] = (after_calls - calls) / requests
    return result


def run(
    args: argparse.Namespace, upstream_port: int, gateways: dict[str, tuple[int, int]]
) -> dict[tuple[str, int], dict[str, float]]:
    plain, stream = wrk_script(), wrk_script(body=STREAM_BODY)
    targets: dict[str, tuple[str, tuple[int, str] | None]] = {
        "upstream directly": (f"http://127.0.0.1:{upstream_port}/v1/chat/completions", None)
    }
    for name, (pid, port) in gateways.items():
        base = f"http://127.0.0.1:{port}"
        targets[name] = (f"{base}/v1/chat/completions", (pid, base))
    for url, _ in targets.values():
        wrk(url, 8, 2, plain)  # warm up connections, caches and the JIT-less interpreter
    runs: dict[tuple[str, int], list[dict[str, float]]] = {}
    for _ in range(args.rounds):
        for connections in (1, 32, 128):
            for name, (url, gateway) in targets.items():
                runs.setdefault((name, connections), []).append(
                    measure(url, connections, args.seconds, plain, gateway)
                )
                time.sleep(0.5)
        direct_stream = f"http://127.0.0.1:{upstream_port + 1}/v1/chat/completions"
        stream_targets = {"upstream directly (stream)": (direct_stream, None)}
        for name in ("gateway --workers 1", "baseline gateway --workers 1"):
            if name in targets:
                stream_targets[f"{name} (stream)"] = targets[name]
        for name, (url, gateway) in stream_targets.items():
            runs.setdefault((name, 32), []).append(measure(url, 32, args.seconds, stream, gateway))
    return {
        key: {k: statistics.median(r[k] for r in results) for k in results[0]}
        for key, results in runs.items()
    }


def render(rows: dict[tuple[str, int], dict[str, float]], args: argparse.Namespace) -> str:
    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} with `loadtest/bench --seconds {args.seconds} "
        f"--rounds {args.rounds}`; {versions()}. wrk (one thread), nginx, redis-server and "
        "the gateway share the machine's cores. CPU is the gateway's (all its processes) "
        "per request; Redis round trips and script calls are the limiter's per request, "
        "from the gateway's own metrics.",
        "",
        "| target | concurrency | requests/s | p50 ms | p99 ms | vs upstream "
        "| gateway CPU µs/req | Redis round trips/req | script calls/req |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (name, connections), row in rows.items():
        base = rows.get(("upstream directly", connections))
        ratio = ""
        streamed = "(stream)" in name
        if base is not None and "gateway" in name and not streamed:
            ratio = f"{row['rps'] / base['rps']:.3f}x req/s, +{row['p50'] - base['p50']:.2f} ms p50"
        if streamed:
            ratio = f"{row['rps'] * STREAM_CHUNKS:.0f} chunks/s"
        extra = " | | |"
        if "cpu_us" in row:
            extra = f" {row['cpu_us']:.0f} | {row['round_trips']:.2f} | {row['script_calls']:.2f} |"
        lines.append(
            f"| {name} | {connections} | {row['rps']:.0f} | {row['p50']:.2f} "
            f"| {row['p99']:.2f} | {ratio} |{extra}"
        )
    lines += ["", *targets(rows)]
    return "\n".join(lines)


def targets(rows: dict[tuple[str, int], dict[str, float]]) -> list[str]:
    """Issue 7's targets for the full path at --workers 1, each met or not."""
    one, up1 = rows[("gateway --workers 1", 1)], rows[("upstream directly", 1)]
    c32, c32w2 = rows[("gateway --workers 1", 32)], rows[("gateway --workers 2", 32)]
    added = one["p50"] - up1["p50"]
    checks = [
        (c32["rps"] >= 3000, f"at least 3,000 requests/s at concurrency 32: {c32['rps']:.0f}"),
        (added <= 0.5, f"at most 0.5 ms added to p50 at concurrency 1: {added:.2f} ms"),
        (
            c32["round_trips"] < 1,
            f"fewer than one Redis round trip per request under load (c32): "
            f"{c32['round_trips']:.2f}",
        ),
        (
            c32w2["rps"] > c32["rps"],
            f"throughput grows with --workers (c32): {c32['rps']:.0f} -> {c32w2['rps']:.0f}",
        ),
    ]
    return [f"- {'met' if ok else 'MISSED'}: {text}" for ok, text in checks]


if __name__ == "__main__":
    main()
