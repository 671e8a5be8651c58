"""What the MCP gateway adds to a tool call, and what its outbound scan costs per KB.

    .venv/bin/python -m loadtest.mcp_overhead [--calls 2000] [--rounds 5]

Starts a redis-server of its own, an upstream MCP server over Streamable HTTP (this
file with `--serve PORT`: aiohttp, a tool `echo` answered at once, as a fast remote
server would), and a gateway process with that server behind it (`gateway serve`, one
worker, JSON access logs and the usage ledger on, as deployed). Then the same client
(aiohttp, one keep-alive session, an MCP session of each) calls `echo` directly and
through the gateway, at concurrency 1 and 32, round by round interleaved, and prints the
p50 and p99 of each and the difference: the gateway's own part of a call (auth, the
Lua limit call, the reach check, its record, one more HTTP hop on loopback).

Then the outbound scan of an external server's arguments (`OutboundGuard.scan_json`,
in this process): microseconds per KB of arguments, for arguments of 1, 16 and 128 KB
of this repository's docs and code, without findings and with one every ~200 bytes,
under `block` (the scan) and `mask` (the scan and the masked copy).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

from gateway.config import hash_key, load_config
from gateway.config.schema import OutboundPolicy
from gateway.serving.outbound import OutboundGuard, SensitiveDataBlocked
from gateway_tools.dev.processes import free_port, gateway_command, spawn, start_redis, stop

ROOT = Path(__file__).resolve().parent.parent
KEY = "sk-bench-mcp"
ARGUMENTS = {"text": "the quick brown fox"}


def serve(port: int) -> None:
    """A fast MCP server over Streamable HTTP: `initialize` and `tools/call echo`."""
    from aiohttp import web

    tools = [{"name": "echo", "description": "Echo.", "inputSchema": {"type": "object"}}]

    async def post(request: web.Request) -> web.Response:
        message = await request.json()
        headers = {"Mcp-Session-Id": "bench"}
        if "id" not in message:
            return web.Response(status=202, headers=headers)
        method = message["method"]
        if method == "initialize":
            result: dict[str, Any] = {
                "protocolVersion": "2025-11-25",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "bench", "version": "1"},
            }
        elif method == "tools/list":
            result = {"tools": tools}
        else:
            text = message["params"]["arguments"].get("text", "")
            result = {"content": [{"type": "text", "text": text}]}
        body = orjson.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result})
        return web.Response(body=body, content_type="application/json", headers=headers)

    async def get(request: web.Request) -> web.Response:
        return web.Response(status=405)

    app = web.Application()
    app.router.add_post("/mcp", post)
    app.router.add_get("/mcp", get)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


async def open_session(http: aiohttp.ClientSession, url: str, key: str | None) -> dict[str, str]:
    """The headers of an MCP session on `url`, its handshake done."""
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    hello = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "bench", "version": "1"},
        },
    }
    async with http.post(url, data=orjson.dumps(hello), headers=headers) as response:
        assert response.status == 200, await response.text()
        headers["Mcp-Session-Id"] = response.headers["Mcp-Session-Id"]
    done = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    async with http.post(url, data=orjson.dumps(done), headers=headers) as response:
        assert response.status == 202
    return headers


async def calls(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str], tool: str, n: int, c: int
) -> list[float]:
    """`n` calls of `tool`, `c` at a time; each one's latency in seconds."""
    body = orjson.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": tool, "arguments": ARGUMENTS},
        }
    )
    latencies: list[float] = []
    left = n

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            started = time.perf_counter()
            async with http.post(url, data=body, headers=headers) as response:
                answer = await response.read()
            latencies.append(time.perf_counter() - started)
            assert response.status == 200 and b'"result"' in answer, answer[:300]

    await asyncio.gather(*(worker() for _ in range(c)))
    return latencies


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def cpu_seconds(pid: int) -> float:
    """A process's CPU time so far (user and system), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(upstream: str, gateway: str, n: int, rounds: int, pid: int) -> None:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        direct_headers = await open_session(http, upstream, None)
        gateway_headers = await open_session(http, gateway, KEY)
        # Warm: the gateway's upstream connection opened, its listing known.
        await calls(http, gateway, gateway_headers, "bench__echo", 200, 8)
        await calls(http, upstream, direct_headers, "echo", 200, 8)
        print(
            "| c | calls | direct p50 | direct p99 | gateway p50 | gateway p99 | added p50 |",
            end="",
        )
        print(" added p99 | gateway CPU a call |")
        print("|---|---|---|---|---|---|---|---|---|")
        for concurrency in (1, 32):
            direct: list[float] = []
            through: list[float] = []
            cpu = 0.0
            for _ in range(rounds):
                direct += await calls(http, upstream, direct_headers, "echo", n, concurrency)
                before = cpu_seconds(pid)
                through += await calls(
                    http, gateway, gateway_headers, "bench__echo", n, concurrency
                )
                cpu += cpu_seconds(pid) - before
            figures = [percentile(v, q) * 1000 for v in (direct, through) for q in (0.5, 0.99)]
            d50, d99, g50, g99 = figures
            print(
                f"| {concurrency} | {len(through)} | {d50:.2f} ms | {d99:.2f} ms | {g50:.2f} ms "
                f"| {g99:.2f} ms | +{g50 - d50:.2f} ms | +{g99 - d99:.2f} ms "
                f"| {cpu / len(through) * 1e6:.0f} µs |"
            )


def scan_cost(config_path: str) -> None:
    """Microseconds per KB of `OutboundGuard.scan_json` on tool arguments."""
    guard = OutboundGuard(load_config(config_path))
    corpus = "".join(
        p.read_text()
        for p in sorted((ROOT / "docs").glob("*.md"))
        + sorted((ROOT / "gateway" / "mcp").glob("*.py"))
    )
    finding = " mail ann.lee@example.com or call +1 415 555 0100 "
    print("\n| arguments | findings | policy | µs per call | µs per KB |")
    print("|---|---|---|---|---|")
    for kb in (1, 16, 128):
        clean = corpus[: kb * 1024]
        dirty = "".join(
            clean[i : i + 200] + (finding if i % 400 == 0 else "")
            for i in range(0, len(clean), 200)
        )[: kb * 1024]
        for label, text in (("none", clean), ("every ~400 B", dirty)):
            arguments = {"path": "docs/notes.md", "content": text}
            for policy in (OutboundPolicy.BLOCK, OutboundPolicy.MASK):
                repeat = max(3, 300 // kb)
                with contextlib.suppress(SensitiveDataBlocked):  # warm: first calls cost more
                    guard.scan_json("req_bench", "acme", "bench", policy, arguments)
                started = time.perf_counter()
                for _ in range(repeat):
                    with contextlib.suppress(SensitiveDataBlocked):
                        guard.scan_json("req_bench", "acme", "bench", policy, arguments)
                each = (time.perf_counter() - started) / repeat * 1e6
                print(f"| {kb} KB | {label} | {policy.value} | {each:,.0f} | {each / kb:,.0f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls a round and concurrency")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return 0
    with tempfile.TemporaryDirectory(prefix="mcp-bench-") as scratch:
        work = Path(scratch)
        redis = start_redis(free_port())
        upstream_port, gateway_port = free_port(start=7000, end=7900), free_port(start=14000)
        server = subprocess.Popen(
            [sys.executable, "-m", "loadtest.mcp_overhead", "--serve", str(upstream_port)],
            cwd=ROOT,
        )
        upstream = f"http://127.0.0.1:{upstream_port}/mcp"
        config = {
            "redis": {"url": f"redis://127.0.0.1:{redis.args[2]}/0"},  # type: ignore[index]
            "server": {"ops": {"port": gateway_port + 1}},
            "ledger": {"url": f"sqlite:///{work / 'usage.db'}"},
            "mcp": {"servers": {"bench": {"url": upstream}}},
            "models": {
                "unused": {"backend": "triton_http", "replicas": [{"url": "http://127.0.0.1:9"}]}
            },
        }
        tenants = {"tenants": {"acme": {"api_keys": [hash_key(KEY)]}}}
        (work / "gateway.yaml").write_text(yaml.safe_dump(config))
        (work / "tenants.yaml").write_text(yaml.safe_dump(tenants))
        env = {k: v for k, v in os.environ.items() if k != "GATEWAY_REDIS_URL"}
        command = gateway_command(
            "serve", "--config", str(work / "gateway.yaml"), "--port", str(gateway_port)
        )
        gateway = spawn(command, env=env, log=work / "gateway.log")
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    import urllib.request

                    urllib.request.urlopen(f"http://127.0.0.1:{gateway_port}/livez", timeout=1)
                    urllib.request.urlopen(f"http://127.0.0.1:{upstream_port}/mcp", timeout=1)
                except urllib.error.HTTPError:
                    break  # the upstream's 405: both are up
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            print(f"tool call, direct and through the gateway ({args.rounds} rounds interleaved)\n")
            asyncio.run(
                measure(
                    upstream,
                    f"http://127.0.0.1:{gateway_port}/mcp",
                    args.calls,
                    args.rounds,
                    gateway.pid,
                )
            )
            scan_cost(str(work / "gateway.yaml"))
        finally:
            stop(gateway)
            server.terminate()
            server.wait()
            stop(redis)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
