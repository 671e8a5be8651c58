"""Redis that fails over, of the tests' own: a primary, a replica and three sentinels
(real redis-server processes, the sentinels in `--sentinel` mode, which is what Debian's
`redis-sentinel` runs), on free ports, with nothing on disk but the sentinels' config."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from redis import Redis as SyncRedis

from gateway_tools.dev.processes import free_port, redis_server_path, stop, wait_listening
from tests import ports

SERVICE = "gateway-primary"
QUORUM = 2
# How long the sentinels wait before they call the primary down: short, for the tests.
DOWN_AFTER_MS = 1000


@dataclass
class SentinelGroup:
    """The processes and ports of one group; `primary` is the port that was primary at start."""

    primary: int
    replica: int
    sentinels: list[int]
    processes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def nodes(self) -> list[str]:
        """The sentinels as `redis.sentinel.nodes` lists them."""
        return [f"127.0.0.1:{port}" for port in self.sentinels]

    def primary_port(self) -> int | None:
        """The port the sentinels name as primary now (None if none answers)."""
        for port in self.sentinels:
            try:
                with SyncRedis(port=port, socket_timeout=1) as sentinel:
                    address = sentinel.execute_command(
                        "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE
                    )
                return int(address[1])
            except Exception:
                continue
        return None

    def kill(self, port: int) -> None:
        """SIGKILL the server on `port`: no goodbye to its replica or the sentinels."""
        self.processes[port].kill()
        self.processes[port].wait()


def _server(port: int, workdir: Path, *options: str) -> subprocess.Popen[bytes]:
    path = redis_server_path()
    assert path is not None
    # --dir: a replica's full sync writes the primary's snapshot to disk, there.
    process = subprocess.Popen(
        [path, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(workdir), *options],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    return wait_listening(process, port, "redis-server")


def _sentinel(port: int, primary: int, workdir: Path) -> subprocess.Popen[bytes]:
    config = workdir / f"sentinel-{port}.conf"
    config.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {workdir}\n"
        f"sentinel monitor {SERVICE} 127.0.0.1 {primary} {QUORUM}\n"
        f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
        f"sentinel failover-timeout {SERVICE} 10000\n"
        f"sentinel parallel-syncs {SERVICE} 1\n"
    )
    path = redis_server_path()
    assert path is not None
    process = subprocess.Popen(
        [path, str(config), "--sentinel"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    return wait_listening(process, port, "redis sentinel")


def _wait_replicating(replica: int, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    with SyncRedis(port=replica, socket_timeout=2) as node:
        while node.info("replication").get("master_link_status") != "up":
            if time.monotonic() > deadline:
                raise TimeoutError(f"replica on {replica} never synced with its primary")
            time.sleep(0.1)


@contextmanager
def sentinel_group(workdir: Path) -> Iterator[SentinelGroup]:
    """A running group, everything stopped at the end whatever happens."""
    if redis_server_path() is None:
        if os.environ.get("CI") == "true":
            pytest.fail("redis-server is required in CI")
        pytest.skip("redis-server is not installed")
    first = free_port(span=5, start=ports.SENTINEL_GROUPS, end=ports.SENTINEL_GROUPS + 2000)
    group = SentinelGroup(first, first + 1, [first + 2, first + 3, first + 4])
    try:
        group.processes[group.primary] = _server(group.primary, workdir)
        group.processes[group.replica] = _server(
            group.replica, workdir, "--replicaof", "127.0.0.1", str(group.primary)
        )
        _wait_replicating(group.replica)
        for port in group.sentinels:
            group.processes[port] = _sentinel(port, group.primary, workdir)
        yield group
    finally:
        for process in group.processes.values():
            stop(process)
