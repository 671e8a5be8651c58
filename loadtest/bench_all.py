"""The benchmark suite: the upstream directly against the gateway with everything on.

    loadtest/bench [--seconds 10] [--rounds 1] [--write docs/benchmarks.md]

Starts an instant OpenAI upstream (nginx: a fixed answer, and on the next port a fixed
20-chunk SSE stream), a redis-server, and `gateway serve` twice with
loadtest/bench-config (limits, admission, metrics, logs on), at `--workers 1` and
`--workers 2`. wrk then measures requests/s and p50/p99 at concurrency 1, 32 and 128 for
each target, the targets interleaved, and the streaming case (chunks relayed per second)
at concurrency 32. Prints a Markdown table with the ratios and, with `--write`, puts it
into that file between the `bench:start` and `bench:end` markers.
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

from gateway.devstack import free_port, gateway_command, spawn, start_redis, stop, wait_http_ok
from loadtest.instant_upstream import STREAM_CHUNKS, start_nginx
from loadtest.stack import BENCH_CONFIG, STREAM_BODY, wrk, wrk_script

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
    gateways: dict[int, tuple[subprocess.Popen[bytes], int]] = {}
    try:
        for workers in (1, 2):
            port = free_port(start=26000 + 1000 * workers)
            command = gateway_command(
                "serve", "--config", str(BENCH_CONFIG), "--host", "127.0.0.1",
                "--port", str(port), "--workers", str(workers),
            )  # fmt: skip
            # Logs on, as in production, into a file rather than the terminal.
            log = Path(tempfile.mkdtemp(prefix="bench-")) / f"gateway-{workers}.log"
            gateways[workers] = (spawn(command, env=env, log=log), port)
        wait_http_ok(f"http://127.0.0.1:{upstream_port}/v1/models", 10, nginx)
        for process, port in gateways.values():
            wait_http_ok(f"http://127.0.0.1:{port}/readyz", 60, process)
        rows = run(args, upstream_port, {w: p for w, (_, p) in gateways.items()})
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


def run(
    args: argparse.Namespace, upstream_port: int, gateway_ports: dict[int, int]
) -> dict[tuple[str, int], dict[str, float]]:
    plain, stream = wrk_script(), wrk_script(body=STREAM_BODY)
    targets = {"upstream directly": f"http://127.0.0.1:{upstream_port}/v1/chat/completions"}
    for workers, port in gateway_ports.items():
        targets[f"gateway --workers {workers}"] = f"http://127.0.0.1:{port}/v1/chat/completions"
    for url in targets.values():
        wrk(url, 8, 2, plain)  # warm up connections, caches and the JIT-less interpreter
    runs: dict[tuple[str, int], list[dict[str, float]]] = {}
    for _ in range(args.rounds):
        for connections in (1, 32, 128):
            for name, url in targets.items():
                runs.setdefault((name, connections), []).append(
                    wrk(url, connections, args.seconds, plain)
                )
                time.sleep(0.5)
        direct_stream = f"http://127.0.0.1:{upstream_port + 1}/v1/chat/completions"
        stream_targets = {
            "upstream directly (stream)": direct_stream,
            "gateway --workers 1 (stream)": targets["gateway --workers 1"],
        }
        for name, url in stream_targets.items():
            runs.setdefault((name, 32), []).append(wrk(url, 32, args.seconds, stream))
    return {
        key: {k: statistics.median(r[k] for r in results) for k in ("rps", "p50", "p99")}
        for key, results in runs.items()
    }


def render(rows: dict[tuple[str, int], dict[str, float]], args: argparse.Namespace) -> str:
    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} with `loadtest/bench --seconds {args.seconds} "
        f"--rounds {args.rounds}`; {versions()}. wrk (one thread), nginx, redis-server and "
        "the gateway share the machine's cores.",
        "",
        "| target | concurrency | requests/s | p50 ms | p99 ms | vs upstream |",
        "|---|---|---|---|---|---|",
    ]
    for (name, connections), row in rows.items():
        base = rows.get(("upstream directly", connections))
        ratio = ""
        streamed = "(stream)" in name
        if base is not None and name.startswith("gateway") and not streamed:
            ratio = f"{row['rps'] / base['rps']:.3f}x req/s, +{row['p50'] - base['p50']:.2f} ms p50"
        if streamed:
            ratio = f"{row['rps'] * STREAM_CHUNKS:.0f} chunks/s"
        lines.append(
            f"| {name} | {connections} | {row['rps']:.0f} | {row['p50']:.2f} "
            f"| {row['p99']:.2f} | {ratio} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
