"""Issue 12's attack table, re-run against the demo: what a hostile client sees now.

    .venv/bin/python -m loadtest.attacks

Starts `gateway demo` (two triton-sim nodes, a redis-server, the gateway) on free
ports, tries each defect and risk the issue lists, and prints one table row per
attack: what was sent and what came back. Nothing here asserts: the e2e tests do
(each row names its test); this is the view an attacker has of the demo.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from gateway.observability.logging import redact
from gateway_tools.dev.processes import free_port, gateway_command, spawn, stop, wait_gateway_ready

ACME = "sk-acme-demo"
GLOBEX = "sk-globex-demo"
Row = tuple[str, str, str]


def call(
    url: str, body: Any = None, key: str | None = ACME, method: str | None = None
) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of one request (no redirect is followed)."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = None if body is None else orjson.dumps(body)
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    opener = urllib.request.build_opener(_NoRedirect, urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any) -> None:
        return None


def error_of(body: bytes) -> str:
    try:
        error = orjson.loads(body)["error"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return body[:80].decode(errors="replace")
    return f"{error.get('code') or error.get('type')}: {error['message'][:110]}"


def raw(port: int, payload: bytes, wait_s: float = 5.0) -> bytes:
    """What the gateway answers to `payload` sent as is on a new connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as sock:
        sock.sendall(payload)
        try:
            return sock.recv(4096)
        except (TimeoutError, ConnectionResetError):
            return b""


def half_open(port: int, count: int) -> Row:
    started = time.monotonic()
    socks = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        socks.append(sock)
    open_ = set(range(count))
    while open_ and time.monotonic() - started < 30:
        for i in list(open_):
            socks[i].settimeout(0.01)
            try:
                if socks[i].recv(4096) is not None:
                    open_.discard(i)
            except TimeoutError:
                pass
            except OSError:
                open_.discard(i)
        time.sleep(0.2)
    for sock in socks:
        sock.close()
    took = time.monotonic() - started
    return (
        f"{count} connections that send half a request head",
        f"all closed by the gateway after {took:.1f} s (408), {len(open_)} still open",
        "tests/e2e/test_connection_limits.py",
    )


def pid_listening(port: int, program: bytes) -> int:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            # redis-server rewrites its title ("redis-server 127.0.0.1:PORT") into argv[0].
            if program in argv[0] and str(port).encode() in b" ".join(argv):
                return int(entry.name)
    raise LookupError(f"no {program!r} on {port}")


def chat(port: int, body: dict[str, Any], key: str = ACME) -> tuple[int, dict[str, str], bytes]:
    return call(f"http://127.0.0.1:{port}/v1/chat/completions", body, key)


def rows(port: int, ops_port: int, log: Path, alive: Callable[[], bool]) -> list[Row]:
    base = f"http://127.0.0.1:{port}"
    hello = [{"role": "user", "content": "hi"}]
    out: list[Row] = [half_open(port, 1000)]
    huge = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 1_048_576 + b"\r\n\r\n"
    out.append(
        ("a 1 MB header", raw(port, huge).split(b"\r\n")[0].decode(), "test_connection_limits")
    )
    many = b"GET /v1/models HTTP/1.1\r\n" + b"X-A: b\r\n" * 100_000 + b"\r\n"
    out.append(
        ("100,000 headers", raw(port, many).split(b"\r\n")[0].decode(), "test_connection_limits")
    )
    status, _, body = chat(
        port, {"model": "llm-small", "messages": [{"role": ["user"], "content": "x"}]}
    )
    out.append(('`"role": ["user"]`', f"{status} {error_of(body)}", "test_fuzz (schemathesis)"))
    status, _, body = call(f"{base}/v1/completions", {"model": "llm-small", "prompt": ""})
    out.append(
        ('`"prompt": ""` on llm-small (gRPC)', f"{status} {error_of(body)}", "test_triton_sim")
    )

    # Readiness with Redis stopped (SIGSTOP: unreachable) under fail mode `local`.
    found = re.search(r"redis-server on 127\.0\.0\.1:(\d+)", log.read_text())
    if found:
        redis_pid = pid_listening(int(found.group(1)), b"redis-server")
        os.kill(redis_pid, signal.SIGSTOP)
        try:
            time.sleep(2)
            status, _, body = call(f"{base}/readyz", key=None)
            state = orjson.loads(body)
            served = chat(port, {"model": "llm-small", "messages": hello, "max_tokens": 2})[0]
        finally:
            os.kill(redis_pid, signal.SIGCONT)
        out.append((
            "`/readyz` while Redis is unreachable (fail mode local)",
            f"{status} status={state['status']} redis up={state['redis']['up']}; a chat: {served}",
            "test_readiness",
        ))  # fmt: skip

    status, headers, body = call(f"{base}/metrics", key=None)
    ops_status = call(f"http://127.0.0.1:{ops_port}/metrics", key=None)[0]
    out.append((
        "`/metrics` on the API port, no key",
        f"{status} {error_of(body)}; the ops listener :{ops_port} answers {ops_status}",
        "test_ops_listener",
    ))  # fmt: skip
    status, headers, body = call(
        f"{base}/v1/chat/completions/", {"model": "llm-small", "messages": hello}
    )
    out.append((
        "`POST /v1/chat/completions/` (a trailing slash)",
        f"{status}, Location: {headers.get('Location') or headers.get('location')}",
        "test_openai_api",
    ))  # fmt: skip
    ids = [
        orjson.loads(chat(port, {"model": "llm-small", "messages": hello, "max_tokens": 1})[2])[
            "id"
        ]
        for _ in range(2)
    ]
    out.append(("two response ids in a row", ", ".join(ids), "test_openai_api"))
    for field, value in (("presence_penalty", 0.5), ("logit_bias", {"1": 5}), ("stop", "")):
        status, _, body = chat(port, {"model": "llm-small", "messages": hello, field: value})
        out.append(
            (
                f"`{field}: {orjson.dumps(value).decode()}`",
                f"{status} {error_of(body)}",
                "test_openai_api",
            )
        )
    refused = None
    for _ in range(200):
        status, headers, body = chat(
            port, {"model": "llm-small", "messages": hello, "max_tokens": 1}, GLOBEX
        )
        if status == 429:
            wait = headers.get("Retry-After") or headers.get("retry-after")
            refused = f"429 Retry-After {wait}: {error_of(body)}"
            break
    out.append(
        ("globex (120 requests/min) past its limit", refused or "never refused", "test_rate_limits")
    )
    for text in ("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "pwd: Tr0ub4dor&3", "db_pw=letmein-42",
                 "passphrase=opensesame", "sk_live_4eC39HqLyjWDarjtT1zdp7dc"):  # fmt: skip
        out.append((f"log_prompts with `{text}`", f"logged as `{redact(text)}`", "test_logging"))

    # A node dies: every model keeps a replica, and the demo keeps serving.
    node = re.search(r"node-a: triton-sim \S+ on 127\.0\.0\.1:(\d+)", log.read_text())
    if node:
        os.kill(pid_listening(int(node.group(1)), b"tritonserver"), signal.SIGKILL)
        started = time.monotonic()
        outcomes: dict[str, list[tuple[float, str]]] = {"llm-large": [], "llm-small": []}
        while time.monotonic() - started < 30:
            for model, seen in outcomes.items():
                status, _, body = chat(port, {"model": model, "messages": hello, "max_tokens": 1})
                outcome = "200" if status == 200 else f"{status} {error_of(body).split(':')[0]}"
                seen.append((time.monotonic() - started, outcome))
            time.sleep(0.5)
        summary = []
        for model, seen in outcomes.items():
            failed = [(at, outcome) for at, outcome in seen if outcome != "200"]
            span = f", {failed[0][0]:.1f}-{failed[-1][0]:.1f} s after the kill" if failed else ""
            kinds = ", ".join(sorted({outcome for _, outcome in failed}))
            summary.append(
                f"{model}: {len(seen) - len(failed)}/{len(seen)} answered"
                + (f" ({kinds}{span})" if failed else "")
            )
        out.append((
            "`kill -9` of node-a's tritonserver, then a request per model every 0.5 s for 30 s",
            "; ".join(summary) + ("; the demo keeps running" if alive() else "; the demo died"),
            "test_demo",
        ))  # fmt: skip
    return out


def main() -> None:
    port = free_port(span=2, start=27000)
    log = Path(f"/tmp/attacks-demo-{port}.log")
    demo = spawn(gateway_command("demo", "--port", str(port), "--ops-port", str(port + 1)), log=log)
    try:
        wait_gateway_ready(f"http://127.0.0.1:{port}", 180, demo)
        table = rows(port, port + 1, log, alive=lambda: demo.poll() is None)
    finally:
        stop(demo)
    print("| attack | what the client sees now | test |\n|---|---|---|")
    for attack, seen, test in table:
        print(f"| {attack} | {seen.replace('|', '/')} | {test} |")


if __name__ == "__main__":
    main()
