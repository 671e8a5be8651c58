"""A gateway under test: a config written to a temp dir and `gateway serve` as a process."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gateway.config import hash_key
from gateway.devstack import free_port, gateway_command, spawn, stop, wait_http_ok

KEYS = {"acme": "sk-test-acme", "globex": "sk-test-globex"}


def tenants_yaml(globex_models: list[str]) -> dict[str, Any]:
    """acme may use every model; globex only `globex_models`."""
    return {
        "tenants": {
            "acme": {
                "api_keys": [hash_key(KEYS["acme"])],
                "priority": "online",
                "models": ["*"],
            },
            "globex": {
                "api_keys": [hash_key(KEYS["globex"])],
                "priority": "batch",
                "models": globex_models,
            },
        }
    }


@dataclass
class Gateway:
    url: str
    process: subprocess.Popen[bytes]
    config_dir: Path

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"


def start_gateway(
    tmp: Path,
    models: dict[str, Any],
    redis_url: str,
    *,
    server: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    globex_models: list[str] | None = None,
) -> Gateway:
    """Write gateway.yaml + tenants.yaml into `tmp` and serve them on a free port.

    The config may use `${SELF_URL}`: the gateway's own URL (for relaying to itself).
    """
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "tenants.yaml").write_text(yaml.safe_dump(tenants_yaml(globex_models or ["llm-small"])))
    gateway = {"redis": {"url": redis_url}, "models": models, "server": server or {}}
    (tmp / "gateway.yaml").write_text(yaml.safe_dump(gateway))
    port = free_port(start=40000)
    process_env = {k: v for k, v in os.environ.items() if k != "GATEWAY_REDIS_URL"}
    process_env.update(env or {})
    process_env["SELF_URL"] = f"http://127.0.0.1:{port}"
    command = gateway_command(
        "serve", "--config", str(tmp / "gateway.yaml"), "--host", "127.0.0.1", "--port", str(port)
    )
    process = spawn(command, env=process_env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(f"{url}/readyz", timeout_s=60, process=process)
    except Exception:
        stop(process)
        raise
    return Gateway(url=url, process=process, config_dir=tmp)


def model(backend: str, urls: list[str], **extra: Any) -> dict[str, Any]:
    """A model entry with short health-check intervals, so tests see changes quickly."""
    return {
        "backend": backend,
        "replicas": [{"url": u} for u in urls],
        "max_tokens_default": 16,
        "health": {"interval_s": 0.5, "timeout_s": 1.0},
        **extra,
    }
