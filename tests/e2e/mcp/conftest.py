"""What the MCP gateway's end-to-end tests share: the upstream servers' config entries,
the SDK client opened with a key, and a gateway with those servers behind it."""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from gateway_tools.dev.processes import free_port, spawn, stop
from gateway_tools.dev.sim.server import TritonSim
from tests import ports
from tests.e2e.stack import Gateway, model, start_gateway, tenant

ROOT = Path(__file__).resolve().parents[3]
SERVERS_DIR = ROOT / "tests" / "mcp_servers"
# What a Python server in the sandbox must see: the interpreter, the virtual environment,
# the servers' own directory.
PYTHON_PATHS = sorted(
    {os.path.realpath(sys.base_prefix), os.path.abspath(sys.prefix), str(SERVERS_DIR)}
)
MCP_KEYS = {
    "root": "sk-test-root",
    "acme": "sk-test-acme",
    "globex": "sk-test-globex",
    "limited": "sk-test-limited",
}


def stdio_server(script: str, **settings: Any) -> dict[str, Any]:
    """A gateway.yaml entry for a Python server of tests/mcp_servers over stdio."""
    return {
        "command": [sys.executable, str(SERVERS_DIR / script)],
        "sandbox": {"read_only": PYTHON_PATHS},
        **settings,
    }  # `settings` may give a sandbox of its own (with PYTHON_PATHS)


def mcp_tenants() -> dict[str, Any]:
    """acme reaches every tool; globex only `notes/echo`; limited all of `notes`, `add`
    twice a minute."""
    return {
        "root": tenant("root", ["*"], admin=True),
        "acme": tenant("acme", ["*"]),
        "globex": tenant("globex", ["*"], mcp={"tools": ["notes/echo"]}),
        "limited": tenant(
            "limited",
            ["*"],
            mcp={"tools": ["notes"], "limits": {"notes/add": {"requests_per_minute": 2}}},
        ),
    }


@asynccontextmanager
async def mcp_session(url: str, key: str) -> AsyncIterator[ClientSession]:
    """The `mcp` SDK's client session on the gateway's `/mcp`, its handshake done."""
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=60) as http,
        streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


TOKEN = "notes-upstream-token-1234"
# Of no shape a redaction knows: only the gateway's knowing it was given keeps it hidden.
HOSTILE_TOKEN = "hostile-cred-q8Zw3"


def wait_port(port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@pytest.fixture(scope="module")
def http_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The notes server and the hostile one over Streamable HTTP."""
    logs = tmp_path_factory.mktemp("mcp-http")
    started = {}
    processes = []
    try:
        for name, script in (("notes", "notes_server.py"), ("hostile", "hostile_server.py")):
            port = free_port(start=ports.MCP_SERVERS, end=ports.MCP_SERVERS + 900)
            command = [sys.executable, str(SERVERS_DIR / script), "--http", str(port)]
            processes.append(spawn(command, log=logs / f"{name}.log"))
            wait_port(port)
            started[name] = f"http://127.0.0.1:{port}/mcp"
        yield started
    finally:
        for process in processes:
            stop(process)


def start_mcp_gateway(
    tmp: Path,
    sims: tuple[TritonSim, TritonSim],
    http_servers: dict[str, str],
    redis_url: str,
    prefix: str | None = None,
) -> Gateway:
    """A gateway with the tests' MCP servers behind it and the tenants of `mcp_tenants`;
    its Redis keys under `prefix`, by default one of `tmp`'s name: pins and sessions its
    own, unless another gateway is given the same prefix."""
    hostile = {"timeout_s": 3, "max_result_bytes": 1024 * 1024}
    notes_dir = str(tmp / "notes" / "{tenant}")  # each tenant's process its own
    (tmp / "notes").mkdir(exist_ok=True)
    servers = {
        "notes": stdio_server(
            "notes_server.py",
            env={"NOTES_DIR": notes_dir},
            env_from={"NOTES_TOKEN": "NOTES_TOKEN"},
            sandbox={"read_only": PYTHON_PATHS, "writable": [notes_dir]},
        ),
        "notes-http": {"url": http_servers["notes"], "bearer_token_env": "NOTES_TOKEN"},
        "hostile": stdio_server(
            "hostile_server.py", env_from={"HOSTILE_TOKEN": "HOSTILE_TOKEN"}, **hostile
        ),
        "hostile-http": {"url": http_servers["hostile"], **hostile},
        # The notes server again, as if outside the cluster: what leaves is scanned.
        "notes-ext": {"url": http_servers["notes"], "external": True, "outbound": "block"},
        "notes-mask": {
            "url": http_servers["notes"],
            "external": True,
            "outbound": "mask",
            "scan_results": True,
        },
    }
    return start_gateway(
        tmp,
        {"llm-small": model("triton_grpc", [sims[0].grpc_target])},
        redis_url,
        tenants=mcp_tenants(),
        gateway={
            "redis": {"url": redis_url, "key_prefix": prefix or f"gw-{tmp.name}"},
            "mcp": {"servers": servers},
            "ledger": {"url": f"sqlite:///{tmp / 'usage.db'}", "flush_interval_ms": 50},
        },
        env={"NOTES_TOKEN": TOKEN, "HOSTILE_TOKEN": HOSTILE_TOKEN},
    )


@pytest.fixture(scope="module")
def mcp_gateway(
    sims: tuple[TritonSim, TritonSim],
    http_servers: dict[str, str],
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Gateway]:
    gateway = start_mcp_gateway(
        tmp_path_factory.mktemp("mcp-gateway"), sims, http_servers, redis_url
    )
    try:
        yield gateway
    finally:
        stop(gateway.process)
