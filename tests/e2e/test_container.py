"""The gateway's image, built and run as a platform runs it (issue 42, item 1).

`scripts/build-image.sh` builds the Dockerfile with podman (here on a Debian base made
with mmdebstrap: no registry is reachable; elsewhere the official Python image). The
container then runs as its non-root user with a read-only root filesystem, against a
triton-sim and a redis-server outside it (host network), with a config mounted read-only
as Kubernetes mounts its ConfigMap: `/readyz`, a chat request, a stream, the ops
listener, and a clean stop on SIGTERM. The image's size and layers are printed (`-s`).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from gateway.config import hash_key
from gateway_tools.dev.processes import free_port
from gateway_tools.dev.sim.server import TritonSim
from tests import ports
from tests.e2e.stack import KEYS
from tests.polling import wait_for

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "localhost/inference-gateway:test"
PODMAN = ["podman", "--runtime", "runc"]
ENV = {"CONTAINERS_CONF": str(ROOT / "deploy" / "podman" / "containers.conf")}


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PODMAN, *args], env={**os.environ, **ENV}, capture_output=True, text=True,
        check=check, timeout=300,
    )  # fmt: skip


@pytest.fixture(scope="module")
def image() -> str:
    """The image built from this tree, its size and layers printed."""
    built = subprocess.run(
        [str(ROOT / "scripts" / "build-image.sh"), IMAGE],
        env={**os.environ, **ENV}, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    size = int(podman("image", "inspect", "--format", "{{.Size}}", IMAGE).stdout)
    history = podman("history", "--format", "{{.Size}}\t{{.CreatedBy}}", IMAGE).stdout
    print(f"\nimage {IMAGE}: {size / 1e6:.0f} MB")
    for line in history.splitlines():
        layer_size, _, created_by = line.partition("\t")
        print(f"  {layer_size:>10}  {created_by[:110]}")
    return IMAGE


@pytest.fixture
def container(
    image: str, sims: tuple[TritonSim, TritonSim], redis_url: str, tmp_path: Path
) -> Iterator[tuple[str, int, int]]:
    """The image serving a config of the test's (mounted read-only), as its user, on a
    read-only root filesystem: (its name, the API port, the ops port)."""
    a, _ = sims
    port = free_port(span=2, start=ports.GATEWAYS, end=ports.CLUSTER_NODES)
    config = tmp_path / "config"
    config.mkdir()
    gateway = {
        "redis": {"url": redis_url},
        "server": {"ops": {"port": port + 1, "host": "127.0.0.1"}},
        "models": {
            "llm-large": {"backend": "triton_http", "replicas": [{"url": a.http_url}]},
        },
    }
    tenants = {"tenants": {"acme": {"api_keys": [hash_key(KEYS["acme"])], "models": ["*"]}}}
    (config / "gateway.yaml").write_text(yaml.safe_dump(gateway))
    (config / "tenants.yaml").write_text(yaml.safe_dump(tenants))
    config.chmod(0o755)
    name = f"gateway-test-{port}"
    podman(
        # No healthcheck timer: podman runs it through systemd, which is not here.
        "run", "--detach", "--name", name, "--network", "host", "--read-only", "--no-healthcheck",
        "--volume", f"{config}:/etc/gateway/config:ro",
        image, "serve", "--config", "/etc/gateway/config/gateway.yaml",
        "--host", "127.0.0.1", "--port", str(port),
    )  # fmt: skip
    try:
        yield name, port, port + 1
    finally:
        podman("rm", "--force", "--time", "0", name, check=False)


def test_the_image_serves_as_its_user_on_a_read_only_root_and_stops_cleanly(
    container: tuple[str, int, int],
) -> None:
    name, port, ops_port = container
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(ready, "the container's /readyz", 60)
    inspected = json.loads(podman("inspect", name).stdout)[0]
    assert inspected["Config"]["User"] == "10001:10001"
    assert inspected["HostConfig"]["ReadonlyRootfs"] is True
    # The process is the unprivileged user, and cannot write its own code.
    assert podman("exec", name, "id", "-u").stdout.strip() == "10001"
    touched = podman("exec", name, "touch", "/opt/venv/x", check=False)
    assert touched.returncode != 0 and "Read-only file system" in touched.stderr

    headers = {"authorization": f"Bearer {KEYS['acme']}"}
    body = {"model": "llm-large", "messages": [{"role": "user", "content": "Hi"}]}
    answer = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=30)
    assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"]
    streamed = httpx.post(
        f"{url}/v1/chat/completions", json={**body, "stream": True}, headers=headers, timeout=30
    )
    assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
    # The ops listener: the metrics counted those two; the API port asks an admin's key.
    metrics = httpx.get(f"http://127.0.0.1:{ops_port}/metrics", timeout=10)
    assert metrics.status_code == 200 and "gateway_requests_total" in metrics.text
    assert httpx.get(f"{url}/metrics", timeout=10).status_code == 401

    podman("stop", "--time", "30", name)  # SIGTERM; SIGKILL (exit 137) only after 30 s
    state = json.loads(podman("inspect", name).stdout)[0]["State"]
    assert state["ExitCode"] == 0, podman("logs", name).stderr[-2000:]
    logs = podman("logs", name)
    assert "Application shutdown complete" in logs.stdout + logs.stderr


def test_the_image_refuses_to_serve_the_demos_published_keys_to_the_world(image: str) -> None:
    # Its baked-in config is the demo's: on 0.0.0.0 `sk-ops-demo` would be an admin key
    # anyone can read in the README (the new-user review of issue 42).
    run = podman(
        "run", "--rm", "--network", "none", "--read-only", "--no-healthcheck",
        "-e", "GATEWAY_REDIS_URL=embedded://", image, check=False,
    )  # fmt: skip
    assert run.returncode == 1, run.stdout + run.stderr
    assert "holds the demo's published API keys" in run.stderr
    assert "GATEWAY_DEMO_KEYS=allow" in run.stderr
