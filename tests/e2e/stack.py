"""A gateway under test: a config written to a temp dir and `gateway serve` as a process."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import hash_key
from gateway_tools.dev.processes import (
    free_port,
    gateway_command,
    spawn,
    stop,
    wait_gateway_ready,
)
from tests import ports

KEYS = {"acme": "sk-test-acme", "globex": "sk-test-globex"}


def tenant(name: str, models: list[str], **settings: Any) -> dict[str, Any]:
    """A tenants.yaml entry whose key is `sk-test-<name>`."""
    return {"api_keys": [hash_key(f"sk-test-{name}")], "models": models, **settings}


def default_tenants(globex_models: list[str]) -> dict[str, Any]:
    """acme (online) may use every model; globex (batch) only `globex_models`."""
    return {
        "acme": tenant("acme", ["*"], priority="online"),
        "globex": tenant("globex", globex_models, priority="batch"),
    }


@dataclass
class Gateway:
    url: str
    process: subprocess.Popen[bytes]
    config_dir: Path
    # The ops listener (/metrics, /admin/*), unless the test's config chose otherwise.
    ops_url: str

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def log(self) -> str:
        """What the gateway has logged so far."""
        return (self.config_dir / "gateway.log").read_text()

    def access_lines(self) -> list[dict[str, Any]]:
        """Every access-log record so far, oldest first."""
        lines = (orjson.loads(line) for line in self.log.splitlines() if line.startswith("{"))
        return [line for line in lines if line.get("logger") == "gateway.access"]

    def access_record(self, request_id: str, timeout_s: float = 10.0) -> dict[str, Any]:
        """The access-log record of one request (written just after its response)."""
        deadline = time.monotonic() + timeout_s
        while True:
            for line in self.log.splitlines():
                if request_id in line and line.startswith("{"):
                    record: dict[str, Any] = orjson.loads(line)
                    if record.get("request_id") == request_id:
                        return record
            if time.monotonic() > deadline:
                raise AssertionError(f"no access-log line for {request_id}")
            time.sleep(0.05)

    @property
    def tenants_path(self) -> Path:
        return self.config_dir / "tenants.yaml"

    def write_tenants(self, tenants: dict[str, Any]) -> None:
        """Replace the tenants file the way an editor does: write aside, then rename."""
        staged = self.config_dir / ".tenants.yaml.tmp"
        staged.write_text(yaml.safe_dump({"tenants": tenants}))
        staged.replace(self.tenants_path)


def start_gateway(
    tmp: Path,
    models: dict[str, Any],
    redis_url: str,
    *,
    tenants: dict[str, Any] | None = None,
    gateway: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    workers: int = 1,
) -> Gateway:
    """Write gateway.yaml + tenants.yaml into `tmp` and serve them on a free port.

    `gateway` adds sections to gateway.yaml; `env` adds to the process's environment.
    The config may use `${SELF_URL}`: the gateway's own URL (for relaying to itself).
    """
    tmp.mkdir(parents=True, exist_ok=True)
    tenants = tenants or default_tenants(["llm-small"])
    (tmp / "tenants.yaml").write_text(yaml.safe_dump({"tenants": tenants}))
    # The API on `port`, the ops listener on the next one unless `gateway` sets it.
    port = free_port(span=2, start=ports.GATEWAYS, end=ports.CLUSTER_NODES)
    settings = {"redis": {"url": redis_url}, "models": models, **(gateway or {})}
    server = settings["server"] = dict(settings.get("server", {}))
    server["ops"] = {"port": port + 1, **server.get("ops", {})}
    (tmp / "gateway.yaml").write_text(yaml.safe_dump(settings))
    process_env = {k: v for k, v in os.environ.items() if k != "GATEWAY_REDIS_URL"}
    process_env.update(env or {})
    process_env["SELF_URL"] = f"http://127.0.0.1:{port}"
    command = gateway_command(
        "serve", "--config", str(tmp / "gateway.yaml"), "--host", "127.0.0.1",
        "--port", str(port), "--workers", str(workers),
    )  # fmt: skip
    process = spawn(command, env=process_env, log=tmp / "gateway.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_gateway_ready(url, timeout_s=60, process=process)
    except Exception as exc:
        stop(process)
        raise RuntimeError(f"gateway did not start:\n{(tmp / 'gateway.log').read_text()}") from exc
    ops_url = f"http://127.0.0.1:{server['ops'].get('port')}"
    return Gateway(url=url, process=process, config_dir=tmp, ops_url=ops_url)


@contextmanager
def running_gateway(
    tmp: Path, models: dict[str, Any], redis_url: str, **options: Any
) -> Iterator[Gateway]:
    """`start_gateway`, stopped at the end whatever happens."""
    gateway = start_gateway(tmp, models, redis_url, **options)
    try:
        yield gateway
    finally:
        stop(gateway.process)


def model(backend: str, urls: list[str], **extra: Any) -> dict[str, Any]:
    """A model entry with short health-check intervals, so tests see changes quickly."""
    return {
        "backend": backend,
        "replicas": [{"url": u} for u in urls],
        "max_tokens_default": 16,
        "health": {"interval_s": 0.5, "timeout_s": 1.0},
        **extra,
    }


def replica_requests(gateway: Gateway, model_name: str) -> dict[str, float]:
    """`gateway_replica_requests_total` of one model, by replica URL."""
    with urllib.request.urlopen(f"{gateway.ops_url}/metrics", timeout=5) as response:
        exposition = response.read().decode()
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == "gateway_replica_requests_total" and labels["model"] == model_name:
                counts[labels["replica"]] = sample.value
    return counts
