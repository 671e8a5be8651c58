"""The benchmark stack: an instant nginx upstream, a redis-server, `gateway serve`, wrk."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import urllib.request
from collections.abc import Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from gateway_tools.dev.processes import (
    free_port,
    gateway_command,
    spawn,
    start_redis,
    stop,
    wait_gateway_ready,
    wait_http_ok,
)
from loadtest.instant_upstream import UPSTREAM_PORTS, start_nginx

# A target's name: a label, or (label, streamed).
K = TypeVar("K", bound=Hashable)

ROOT = Path(__file__).resolve().parent.parent
BENCH_CONFIG = ROOT / "loadtest/bench-config/gateway.yaml"
BODY = '{"model":"fake-llama-8b","messages":[{"role":"user","content":"Hello"}],"max_tokens":16}'


STREAM_BODY = (
    '{"model":"fake-llama-8b-stream","messages":[{"role":"user","content":"Hello"}],'
    '"max_tokens":20,"stream":true}'
)

# The same streamed request to the model behind the instant Triton upstream.
TRITON_STREAM_BODY = STREAM_BODY.replace("fake-llama-8b-stream", "fake-llama-8b-triton")


# An admin tenant's key (loadtest/bench-config/tenants.yaml): /metrics on the API port.
ADMIN_KEY = "sk-bench-admin"


def scrape_metrics(gateway_url: str) -> str:
    """The gateway's /metrics exposition, read on the API port with the admin key (a
    baseline tree from before the ops listener serves it there without a key)."""
    request = urllib.request.Request(
        f"{gateway_url}/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        return str(response.read().decode())


def wrk_script(key: str = "sk-bench-1234", body: str = BODY) -> Path:
    """A wrk Lua script that posts a chat request (`body`) with `key`."""
    script = Path(tempfile.mkdtemp()) / "post.lua"
    # A long bracket string: the body as it is, quotes and backslashes included.
    level = "=" * next(n for n in range(16) if f"]{'=' * n}]" not in body)
    script.write_text(
        f"""
wrk.method = "POST"
wrk.body = [{level}[{body}]{level}]
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer {key}"
"""
    )
    return script


def wrk(url: str, connections: int, seconds: float, script: Path) -> dict[str, float]:
    """Run wrk (one thread); requests/s, p50 and p99 in ms, and the request count."""
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", str(script), url],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    if "Non-2xx" in out:
        raise RuntimeError(f"non-2xx responses from {url}:\n{out}")
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    total = re.search(r"(\d+) requests in", out)
    assert rps and total, out
    return {
        "rps": float(rps.group(1)),
        "p50": _latency(out, "50%"),
        "p99": _latency(out, "99%"),
        "requests": float(total.group(1)),
    }


def _latency(out: str, label: str) -> float:
    match = re.search(rf"{label}\s+([\d.]+)(us|ms|s)\b", out)
    assert match, out
    value, unit = float(match.group(1)), match.group(2)
    return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) used so far by process `pid` and its live children."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for candidate in [pid, *_children(pid)]:
        try:
            fields = Path(f"/proc/{candidate}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return total


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children = (task / "children").read_text().split()
        for child in map(int, children):
            found += [child, *_children(child)]
    return found


def upstream_env(upstream_port: int) -> dict[str, str]:
    """The variables loadtest/bench-config reads for the instant upstream's three ports
    (start_nginx(upstream_port))."""
    base = "http://127.0.0.1"
    return {
        "BENCH_UPSTREAM_URL": f"{base}:{upstream_port}",
        "BENCH_STREAM_UPSTREAM_URL": f"{base}:{upstream_port + 1}",
        "BENCH_TRITON_UPSTREAM_URL": f"{base}:{upstream_port + 2}",
    }


@dataclass
class Stack:
    upstream_url: str
    redis_port: int
    gateway_url: str
    # The gateway's process: with --workers 1, the worker that serves.
    gateway_pid: int

    @property
    def chat_url(self) -> str:
        return f"{self.gateway_url}/v1/chat/completions"


@contextmanager
def bench_stack(workers: int = 1, log_level: str = "WARNING") -> Iterator[Stack]:
    """nginx + redis-server + `gateway serve` with loadtest/bench-config, all on 127.0.0.1.

    The gateway's log goes to a temporary file (INFO writes one access line a request).
    """
    upstream_port = free_port(span=UPSTREAM_PORTS)
    redis_port = free_port(start=25000)
    gateway_port = free_port(start=26000)
    nginx, _ = start_nginx(upstream_port)
    redis = start_redis(redis_port)
    env = dict(os.environ)
    env.update(upstream_env(upstream_port))
    env["BENCH_REDIS_URL"] = f"redis://127.0.0.1:{redis_port}/0"
    env["GATEWAY_LOG_LEVEL"] = log_level
    command = gateway_command(
        "serve", "--config", str(BENCH_CONFIG), "--host", "127.0.0.1",
        "--port", str(gateway_port), "--workers", str(workers),
    )  # fmt: skip
    log = Path(tempfile.mkdtemp(prefix="bench-")) / "gateway.log"
    gateway = spawn(command, env=env, log=log)
    try:
        wait_http_ok(f"http://127.0.0.1:{upstream_port}/v1/models", 10, nginx)
        wait_gateway_ready(f"http://127.0.0.1:{gateway_port}", 30, gateway)
        yield Stack(
            upstream_url=f"http://127.0.0.1:{upstream_port}",
            redis_port=redis_port,
            gateway_url=f"http://127.0.0.1:{gateway_port}",
            gateway_pid=gateway.pid,
        )
    finally:
        stop(gateway)
        stop(redis)
        stop(nginx)


def interleaved(
    stack: Stack,
    targets: Mapping[K, tuple[str, Path]],
    seconds: float,
    rounds: int,
    concurrency: Sequence[int] = (1, 32),
) -> dict[tuple[K, int], list[dict[str, float]]]:
    """wrk against each target (url, script) after a warm-up, the targets interleaved in
    each round and at each concurrency, with the gateway's CPU per request (`cpu_us`):
    every run of each (target, concurrency)."""
    results: dict[tuple[K, int], list[dict[str, float]]] = {}
    for url, script in targets.values():
        wrk(url, 4, 1, script)  # warm up
    for _ in range(rounds):
        for connections in concurrency:
            for name, (url, script) in targets.items():
                cpu = cpu_seconds(stack.gateway_pid)
                run = wrk(url, connections, seconds, script)
                run["cpu_us"] = 1e6 * (cpu_seconds(stack.gateway_pid) - cpu) / run["requests"]
                results.setdefault((name, connections), []).append(run)
    return results
