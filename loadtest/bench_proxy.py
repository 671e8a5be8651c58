"""Requests/s and latency of one non-streaming chat request: upstream directly vs the gateway.

    .venv/bin/python -m loadtest.bench_proxy [--seconds 10] [--rounds 2] [--workers 1]
        [--log-level INFO]

Starts nginx as an instant OpenAI upstream, a redis-server and `gateway serve` with
loadtest/bench-config, then runs wrk against both targets, interleaved, at
concurrency 1 and 32, and prints a Markdown table of medians.
"""

from __future__ import annotations

import argparse
import shutil
import statistics

from loadtest.stack import bench_stack, cpu_seconds, wrk, wrk_script


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--log-level", default="INFO", help="INFO logs every request")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (apt-get install wrk)")
    script = wrk_script()
    with bench_stack(args.workers, args.log_level) as stack:
        targets = {
            "upstream directly": f"{stack.upstream_url}/v1/chat/completions",
            f"gateway (--workers {args.workers})": stack.chat_url,
        }
        for url in targets.values():
            wrk(url, 8, 2, script)  # warm up connections and caches
        results: dict[tuple[str, int], list[dict[str, float]]] = {}
        for _ in range(args.rounds):
            for connections in (1, 32):
                for name, url in targets.items():
                    cpu = cpu_seconds(stack.gateway_pid)
                    run = wrk(url, connections, args.seconds, script)
                    # The gateway's CPU per request (zero-ish for the upstream's runs).
                    used = cpu_seconds(stack.gateway_pid) - cpu
                    run["cpu_us"] = 1e6 * used / run["requests"]
                    results.setdefault((name, connections), []).append(run)
    print("| target | concurrency | requests/s | p50 ms | p99 ms | gateway CPU us/request |")
    print("|---|---|---|---|---|---|")
    for (name, connections), runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in ("rps", "p50", "p99", "cpu_us")}
        cpu = f"{med['cpu_us']:.0f}" if name.startswith("gateway") else ""
        row = f"{med['rps']:.0f} | {med['p50']:.2f} | {med['p99']:.2f} | {cpu}"
        print(f"| {name} | {connections} | {row} |")


if __name__ == "__main__":
    main()
