"""What the rate limiter costs the real server, per request, in gateway CPU.

`gateway serve --workers 1` with loadtest/bench-config, wrk at `--connections` (32 by
default) sending the same chat request with two keys, interleaved round by round:
sk-bench-1234 (a limited tenant: an admission and a settle in Redis per request) and
sk-bench-unlimited (no limiter, no Redis). The difference of their CPU per request is
what the limiter costs where requests arrive staggered, unlike loadtest/limiter_cost's
lock-step clients, so each Redis round trip carries few calls and its fixed cost
counts. Also printed: the limited tenant's Redis round trips and calls per request.

What it found (2 shared cores, c=32): 350-360 against 315 µs, so 35-45 µs a request,
at 0.14-0.18 round trips a request. A round trip's fixed cost is about 32 µs
(`loadtest.limiter_cost --concurrency 1`, one round trip a request, less the 13 µs a
request costs at 32 calls a round trip), the send that wakes Redis the largest part: so
about 5 µs of those are round trips, the rest is per request (the admission and its
headers, the reply's extra headers, the request's extra suspension). Runs of one target
spread by ±20 µs on a shared machine: compare medians of many rounds.

`--baseline DIR` also starts the gateway of another source tree (a `git worktree` of an
earlier commit; this venv) on the same nginx and Redis, and runs it interleaved with
this one: the one way to compare two versions on a machine whose speed drifts.

    .venv/bin/python -m loadtest.limiter_server_cost --seconds 6 --rounds 3 \
        --baseline /tmp/base
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from gateway_tools.dev.processes import free_port, gateway_command, spawn, stop, wait_http_ok
from loadtest.bench_all import redis_totals
from loadtest.stack import (
    BENCH_CONFIG,
    bench_stack,
    cpu_seconds,
    upstream_env,
    wrk,
    wrk_script,
)

LIMITED, UNLIMITED = "sk-bench-1234", "sk-bench-unlimited"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--baseline", type=Path, help="another source tree to compare with")
    args = parser.parse_args()
    with bench_stack(workers=1, log_level="INFO") as stack:
        # (name, pid, base url)
        gateways = [("this tree", stack.gateway_pid, stack.gateway_url)]
        baseline = None
        if args.baseline is not None:
            port = free_port(start=27000)
            env = dict(os.environ)
            env.update(upstream_env(int(stack.upstream_url.rsplit(":", 1)[1])))
            env["BENCH_REDIS_URL"] = f"redis://127.0.0.1:{stack.redis_port}/0"
            env["GATEWAY_LOG_LEVEL"] = "INFO"
            # The other tree's package first; the working directory not on the path.
            env["PYTHONPATH"] = str(args.baseline.resolve())
            env["PYTHONSAFEPATH"] = "1"
            command = gateway_command(
                "serve", "--config", str(BENCH_CONFIG), "--host", "127.0.0.1",
                "--port", str(port), "--workers", "1",
            )  # fmt: skip
            log = Path(tempfile.mkdtemp(prefix="bench-")) / "baseline.log"
            baseline = spawn(command, env=env, log=log)
            url = f"http://127.0.0.1:{port}"
            wait_http_ok(f"{url}/readyz", 60, baseline)
            gateways.append(("baseline", baseline.pid, url))
        try:
            results = run(args, gateways)
        finally:
            if baseline is not None:
                stop(baseline)
    report(results)


def run(
    args: argparse.Namespace, gateways: list[tuple[str, int, str]]
) -> dict[tuple[str, str], list[dict[str, float]]]:
    """Every (gateway, key) run, in rounds, each round every target once."""
    scripts = {key: wrk_script(key) for key in (LIMITED, UNLIMITED)}
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    for _, _, url in gateways:
        for script in scripts.values():
            wrk(f"{url}/v1/chat/completions", 4, 1, script)  # warm up
    for _ in range(args.rounds):
        for name, pid, url in gateways:
            for key, script in scripts.items():
                trips, calls = redis_totals(url)
                cpu, system = cpu_seconds(pid), system_seconds(pid)
                result = wrk(f"{url}/v1/chat/completions", args.connections, args.seconds, script)
                result["cpu_us"] = 1e6 * (cpu_seconds(pid) - cpu) / result["requests"]
                result["sys_us"] = 1e6 * (system_seconds(pid) - system) / result["requests"]
                after_trips, after_calls = redis_totals(url)
                result["trips"] = (after_trips - trips) / result["requests"]
                result["calls"] = (after_calls - calls) / result["requests"]
                results.setdefault((name, key), []).append(result)
    return results


def system_seconds(pid: int) -> float:
    """CPU time process `pid` (a gateway worker) has spent in the kernel so far: its
    system calls, such as the sends that wake Redis."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[12]) / os.sysconf("SC_CLK_TCK")


def report(results: dict[tuple[str, str], list[dict[str, float]]]) -> None:
    """Per gateway: CPU per request of each key (median and every run), and the
    limiter's cost as the median of the per-round differences."""
    names = dict.fromkeys(name for name, _ in results)
    for name in names:
        limited, unlimited = results[(name, LIMITED)], results[(name, UNLIMITED)]
        for key, runs in ((LIMITED, limited), (UNLIMITED, unlimited)):
            cpus = [round(r["cpu_us"]) for r in runs]
            system = statistics.median(r["sys_us"] for r in runs)
            rps = statistics.median(r["rps"] for r in runs)
            print(
                f"{name:10} {key:19} cpu µs/req median {statistics.median(cpus):4.0f} "
                f"(of which in the kernel {system:3.0f}) runs {cpus}  req/s {rps:,.0f}"
            )
        diffs = [a["cpu_us"] - b["cpu_us"] for a, b in zip(limited, unlimited, strict=True)]
        trips = statistics.median(r["trips"] for r in limited)
        calls = statistics.median(r["calls"] for r in limited)
        print(
            f"{name:10} limiter µs/req median {statistics.median(diffs):.1f} "
            f"runs {[round(d, 1) for d in diffs]}  "
            f"Redis round trips/req {trips:.3f}, calls/req {calls:.2f}"
        )


if __name__ == "__main__":
    main()
