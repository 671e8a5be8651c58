"""A 3-master Redis Cluster of the tests' own, on free ports (no replicas, nothing on disk)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis as SyncRedis

from gateway_tools.dev.processes import (
    free_port,
    port_is_free,
    redis_server_path,
    stop,
    wait_listening,
)
from tests import ports

CLUSTER_SIZE = 3
# Redis Cluster nodes talk to each other on their port + 10000.
BUS_OFFSET = 10000


def _require_redis_binaries() -> None:
    if redis_server_path() is None or shutil.which("redis-cli") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("redis-server and redis-cli are required in CI")
        pytest.skip("redis-server or redis-cli is not installed")


def _cluster_ports() -> list[int]:
    """CLUSTER_SIZE consecutive free ports whose cluster bus ports are free too."""
    for start in range(ports.CLUSTER_NODES, ports.PROMETHEUS, 1000):
        port = free_port(span=CLUSTER_SIZE, start=start, end=start + 1000)
        if all(port_is_free(port + BUS_OFFSET + i) for i in range(CLUSTER_SIZE)):
            return [port + i for i in range(CLUSTER_SIZE)]
    raise RuntimeError("no free ports for a Redis Cluster")


def _start_node(port: int, workdir: Path) -> subprocess.Popen[bytes]:
    server = redis_server_path()
    assert server is not None
    process = subprocess.Popen(
        [
            server,
            "--port", str(port),
            "--bind", "127.0.0.1",
            "--cluster-enabled", "yes",
            "--cluster-config-file", str(workdir / f"nodes-{port}.conf"),
            "--cluster-node-timeout", "5000",
            "--dir", str(workdir),
            "--save", "",
            "--appendonly", "no",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    return wait_listening(process, port, "cluster node")


def _wait_cluster_ok(ports: list[int], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    pending = list(ports)
    while pending:
        with SyncRedis(port=pending[0], socket_timeout=2) as node:
            info = node.execute_command("CLUSTER INFO")
        state = info.get("cluster_state") if isinstance(info, dict) else None
        if state == "ok":
            pending.pop(0)
            continue
        if time.monotonic() > deadline:
            raise TimeoutError(f"node {pending[0]}: cluster_state {state!r}")
        time.sleep(0.1)


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[int]]:
    """The ports of a fresh 3-master Redis Cluster (no replicas, nothing on disk)."""
    _require_redis_binaries()
    workdir = tmp_path_factory.mktemp("redis-cluster")
    ports = _cluster_ports()
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for port in ports:
            processes.append(_start_node(port, workdir))
        redis_cli = shutil.which("redis-cli")
        assert redis_cli is not None
        subprocess.run(
            [redis_cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports),
             "--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=60,
        )  # fmt: skip
        _wait_cluster_ok(ports, timeout_s=30)
        yield ports
    finally:
        for process in processes:
            stop(process)
