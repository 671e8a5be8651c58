"""gateway_control.scheduler.experiments.packing: the workload and the packing experiment."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest

from gateway_control.scheduler.cluster import load_nodes, load_pods
from gateway_control.scheduler.experiments.packing import build_workload, run_packing
from gateway_control.scheduler.policies.registry import POLICY_NAMES
from tests.unit.scheduler.packing_helpers import write_slice


def test_workload_reaches_the_inflation_target(tmp_path: Path) -> None:
    _, pods_csv = write_slice(tmp_path)
    pods = load_pods(pods_csv)
    workload = build_workload(pods, 50_000, seed=1)
    requested = sum(p.requested_milli for p in workload)
    assert requested >= 65_000
    assert requested - max(p.requested_milli for p in pods) < 65_000  # stopped at once
    assert {p.name for p in pods} <= {p.name for p in workload}
    assert workload == build_workload(pods, 50_000, seed=1)


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_packing_experiment(tmp_path: Path, policy: str) -> None:
    nodes_csv, pods_csv = write_slice(tmp_path)
    nodes, pods = load_nodes(nodes_csv), load_pods(pods_csv)
    result = run_packing(nodes, pods, policy, seed=3)
    doc = result.to_json()
    assert set(doc) == {"policy", "seed", "total_gpus", "allocated_gpu_pct", "fragmented_gpu_pct"}
    assert doc["total_gpus"] == 56
    allocated, fragmented = doc["allocated_gpu_pct"], doc["fragmented_gpu_pct"]
    assert len(allocated) == len(fragmented) == 131
    assert allocated[0] == 0.0
    assert all(a <= b for a, b in pairwise(allocated))
    assert all(0 <= a <= 100 for a in allocated)
    assert all(0 <= f <= 100 - a + 1e-6 for a, f in zip(allocated, fragmented, strict=True))
    assert allocated[130] > 50
    assert all(node.gpu_free == [1000] * node.gpus for node in nodes)  # input left alone
    assert run_packing(nodes, pods, policy, seed=3).to_json() == doc
    assert result.failed > 0  # 130% cannot all fit
