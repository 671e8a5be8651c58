"""Requests/s and latency of one non-streaming chat request: upstream directly vs the gateway.

    .venv/bin/python loadtest/bench_proxy.py [--seconds 10] [--rounds 2]

Starts nginx as an instant OpenAI upstream, a redis-server and `gateway serve` with
loadtest/bench-config, then runs wrk against both targets, interleaved, at
concurrency 1 and 32, and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

from gateway.devstack import free_port, gateway_command, spawn, start_redis, stop, wait_http_ok
from loadtest.instant_upstream import start_nginx

ROOT = Path(__file__).resolve().parent.parent
BODY = '{"model":"fake-llama-8b","messages":[{"role":"user","content":"Hello"}],"max_tokens":16}'
WRK_SCRIPT = f"""
wrk.method = "POST"
wrk.body = '{BODY}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer sk-bench-1234"
"""


def wrk(url: str, connections: int, seconds: int, script: Path) -> dict[str, float]:
    """Run wrk (one thread) and read requests/s, p50 and p99 in ms."""
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", str(script), url],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    if "Non-2xx" in out:
        raise RuntimeError(f"non-2xx responses from {url}:\n{out}")
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    return {"rps": rps, "p50": _latency(out, "50%"), "p99": _latency(out, "99%")}


def _latency(out: str, label: str) -> float:
    match = re.search(rf"{label}\s+([\d.]+)(us|ms|s)\b", out)
    assert match, out
    value, unit = float(match.group(1)), match.group(2)
    return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (apt-get install wrk)")

    upstream_port, redis_port, gateway_port = (
        free_port(),
        free_port(start=25000),
        free_port(start=26000),
    )
    nginx, _ = start_nginx(upstream_port)
    redis = start_redis(redis_port)
    env = dict(os.environ)
    env["BENCH_UPSTREAM_URL"] = f"http://127.0.0.1:{upstream_port}"
    env["BENCH_REDIS_URL"] = f"redis://127.0.0.1:{redis_port}/0"
    env["GATEWAY_LOG_LEVEL"] = "WARNING"
    gateway = spawn(
        gateway_command(
            "serve",
            "--config",
            str(ROOT / "loadtest/bench-config/gateway.yaml"),
            "--host",
            "127.0.0.1",
            "--port",
            str(gateway_port),
            "--workers",
            str(args.workers),
        ),
        env=env,
    )
    try:
        wait_http_ok(f"http://127.0.0.1:{upstream_port}/v1/models", 10, nginx)
        wait_http_ok(f"http://127.0.0.1:{gateway_port}/readyz", 30, gateway)
        script = Path(tempfile.mkdtemp()) / "post.lua"
        script.write_text(WRK_SCRIPT)
        targets = {
            "upstream directly": f"http://127.0.0.1:{upstream_port}/v1/chat/completions",
            f"gateway (--workers {args.workers})": f"http://127.0.0.1:{gateway_port}/v1/chat/completions",
        }
        for url in targets.values():
            wrk(url, 8, 2, script)  # warm up connections and caches
        results: dict[tuple[str, int], list[dict[str, float]]] = {}
        for _ in range(args.rounds):
            for connections in (1, 32):
                for name, url in targets.items():
                    results.setdefault((name, connections), []).append(
                        wrk(url, connections, args.seconds, script)
                    )
        print("| target | concurrency | requests/s | p50 ms | p99 ms |")
        print("|---|---|---|---|---|")
        for (name, connections), runs in results.items():
            med = {k: statistics.median(r[k] for r in runs) for k in ("rps", "p50", "p99")}
            row = f"{med['rps']:.0f} | {med['p50']:.2f} | {med['p99']:.2f}"
            print(f"| {name} | {connections} | {row} |")
    finally:
        stop(gateway)
        stop(redis)
        stop(nginx)


if __name__ == "__main__":
    main()
