"""`gateway place --apply` loads and unloads models on a real Triton server (explicit
model-control mode) so that it serves what the plan puts on it."""

from __future__ import annotations

import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gateway_tools.dev.processes import gateway_command
from gateway_tools.dev.sim.server import TritonSim
from tests.e2e.conftest import start_sim


@pytest.fixture(scope="module")
def node() -> Iterator[TritonSim]:
    """A Triton server of this module's own: the test unloads its models."""
    sim = start_sim("llm-large=4,llm-small=1")
    try:
        yield sim
    finally:
        sim.stop()


def ready(sim: TritonSim, model: str) -> bool:
    try:
        with urllib.request.urlopen(f"{sim.http_url}/v2/models/{model}/ready") as response:
            return response.status == 200
    except urllib.error.HTTPError:
        return False


def place(tmp_path: Path, sim: TritonSim, gpus: int) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "cluster.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "nodes": [{"name": "node-a", "url": sim.http_url, "gpus": gpus}],
                "deployments": [
                    {"model": "llm-large", "gpus": 1, "priority": 0},
                    {"model": "llm-small", "gpus": 1, "priority": 5},
                ],
            }
        )
    )
    command = gateway_command("place", "--config", str(path), "--apply")
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_apply_serves_what_the_plan_places_and_nothing_else(
    tmp_path: Path, node: TritonSim
) -> None:
    assert ready(node, "llm-large") and ready(node, "llm-small")
    # One GPU: the higher-priority llm-small keeps it; llm-large fits nowhere.
    shrunk = place(tmp_path, node, gpus=1)
    assert shrunk.returncode == 1, shrunk.stderr  # a replica fits nowhere
    assert "llm-large: 1 replica(s) fit nowhere" in shrunk.stdout
    assert "node-a: unload llm-large" in shrunk.stdout
    assert not ready(node, "llm-large")
    assert ready(node, "llm-small")
    # Two GPUs: llm-large is placed, and loaded again.
    grown = place(tmp_path, node, gpus=2)
    assert grown.returncode == 0, grown.stderr
    assert "node-a: load llm-large" in grown.stdout
    assert ready(node, "llm-large") and ready(node, "llm-small")
