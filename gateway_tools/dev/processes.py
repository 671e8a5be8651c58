"""Local processes for the demo and the tests: free ports, redis-server, readiness waits."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

# No proxies: an http_proxy in the environment must not intercept calls to 127.0.0.1.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def port_is_free(port: int) -> bool:
    """Whether a server can listen on `port` of 127.0.0.1 now. With SO_REUSEADDR, as the
    servers it is asked for bind (uvicorn, redis-server): the connections a killed server
    left in TIME_WAIT do not hold its port (a demo restarted after a `kill -9` was told
    its port was taken)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def ephemeral_ports() -> range:
    """The ports the kernel hands to outgoing connections (Linux's default if unknown)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return range(int(low), int(high) + 1)
    except (OSError, ValueError):
        return range(32768, 61000)


def free_port(span: int = 1, start: int = 20000, end: int | None = None) -> int:
    """A port P in [start, end) such that P .. P+span-1 are free on 127.0.0.1.

    `end` defaults to `start` + 4000: each kind of server keeps to its own range, so a
    port picked for one kind is never taken meanwhile by a server of another kind that
    has not bound it yet. Ports in the ephemeral range are never picked: any outgoing
    connection could take one before the server binds it. Callers in several
    processes start their search at different places in the range.
    """
    end = start + 4000 if end is None else end
    ephemeral = ephemeral_ports()
    size = end - start - span + 1
    offset = (os.getpid() * 37) % size
    for step in range(0, size, span):
        port = start + (offset + step) % size
        wanted = range(port, port + span)
        if any(p in ephemeral for p in wanted):
            continue
        if all(port_is_free(p) for p in wanted):
            return port
    raise RuntimeError(
        f"no {span} free consecutive ports in [{start}, {end}) below {ephemeral.start}"
    )


class Cancelled(Exception):
    """A wait was given up because a stop was requested (e.g. Ctrl-C)."""


def _pause(seconds: float, cancel: threading.Event | None) -> None:
    """Sleep, or return early when `cancel` is set; Cancelled if it is."""
    if cancel is None:
        time.sleep(seconds)
    elif cancel.wait(seconds):
        raise Cancelled("stop requested")


def wait_http_ok(
    url: str,
    timeout_s: float,
    process: subprocess.Popen[bytes] | None = None,
    cancel: threading.Event | None = None,
    body_ok: Callable[[bytes], bool] | None = None,
) -> None:
    """Poll `url` until it answers 200 (with a body `body_ok` accepts, if given); fail
    early if `process` exits.

    Raises Cancelled as soon as `cancel` is set (within about a second).
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _pause(0, cancel)
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode}")
        try:
            with _HTTP.open(url, timeout=1.0) as response:
                if response.status == 200 and (body_ok is None or body_ok(response.read())):
                    return
        except (urllib.error.URLError, OSError):
            pass
        _pause(0.1, cancel)
    raise TimeoutError(f"{url} was not ready within {timeout_s:g}s")


def wait_gateway_ready(
    base_url: str,
    timeout_s: float,
    process: subprocess.Popen[bytes] | None = None,
    cancel: threading.Event | None = None,
) -> None:
    """Poll a gateway's `/readyz` until it is ready with nothing degraded: Redis up and a
    healthy replica for every model (a load balancer needs less; a test or a demo that
    starts sending at once needs this)."""

    def all_ok(body: bytes) -> bool:
        return bool(json.loads(body).get("status") == "ok")

    wait_http_ok(f"{base_url}/readyz", timeout_s, process, cancel, body_ok=all_ok)


def redis_server_path() -> str | None:
    return shutil.which("redis-server")


def start_redis(port: int, cancel: threading.Event | None = None) -> subprocess.Popen[bytes]:
    """A throwaway redis-server on `port` that keeps nothing on disk."""
    path = redis_server_path()
    if path is None:
        raise FileNotFoundError("redis-server is not installed")
    process = subprocess.Popen(
        [path, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    return wait_listening(process, port, "redis-server", cancel=cancel)


def wait_listening(
    process: subprocess.Popen[bytes],
    port: int,
    what: str,
    timeout_s: float = 10.0,
    cancel: threading.Event | None = None,
) -> subprocess.Popen[bytes]:
    """Wait until `process` accepts connections on `port`; stop it and fail otherwise
    (Cancelled when `cancel` is set first)."""
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    return process
            if process.poll() is not None:
                raise RuntimeError(f"{what} on port {port} exited with {process.returncode}")
            _pause(0.05, cancel)
    except Cancelled:
        stop(process)
        raise
    stop(process)
    raise TimeoutError(f"{what} on port {port} did not start")


def gateway_command(*args: str) -> list[str]:
    """The `gateway` CLI of this interpreter (works without the console script on PATH)."""
    return [sys.executable, "-m", "gateway.cli", *args]


def spawn(
    command: Sequence[str], env: dict[str, str] | None = None, log: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start a child in its own session, so stopping it stops everything it started.

    With `log`, its output goes to that file instead of this process's.
    """
    if log is None:
        return subprocess.Popen(list(command), env=env, start_new_session=True)
    with log.open("ab") as out:
        return subprocess.Popen(
            list(command), env=env, start_new_session=True, stdout=out, stderr=subprocess.STDOUT
        )


def stop(process: subprocess.Popen[bytes], timeout_s: float = 15.0) -> None:
    """SIGTERM, wait, then SIGKILL the child's whole session."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
