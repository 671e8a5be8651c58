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

from loadtest.stack import bench_stack, wrk, wrk_script


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
                    run = wrk(url, connections, args.seconds, script)
                    results.setdefault((name, connections), []).append(run)
    print("| target | concurrency | requests/s | p50 ms | p99 ms |")
    print("|---|---|---|---|---|")
    for (name, connections), runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in ("rps", "p50", "p99")}
        row = f"{med['rps']:.0f} | {med['p50']:.2f} | {med['p99']:.2f}"
        print(f"| {name} | {connections} | {row} |")


if __name__ == "__main__":
    main()
