"""Derived workload families: GPU-sharing-heavy, multi-GPU-heavy, GPU-type-constrained."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway_control.scheduler.cluster import Node, Pod, load_pods
from gateway_control.scheduler.experiments.workloads import (
    derive,
    family_names,
    parse_family,
    write_pods,
)


def base_pods() -> list[Pod]:
    pods = [Pod(f"s{i}", 1, 250 + 50 * (i % 5), 4000, 8192) for i in range(40)]
    pods += [Pod(f"w{i}", 1, 1000, 8000, 16384) for i in range(40)]
    pods += [Pod(f"m{i}", (2, 4, 8)[i % 3], 1000, 32000, 65536) for i in range(6)]
    pods += [Pod(f"c{i}", 0, 0, 16000, 32768) for i in range(10)]
    return pods


def cluster_nodes() -> list[Node]:
    return [
        Node("g", 8, "G2", 96000, 393216),
        Node("t", 2, "T4", 104000, 524288),
        Node("p", 2, "P100", 16000, 122880),
    ]


def gpu_of(pods: list[Pod], which: str) -> float:
    """The share of the GPU requests carried by sharing or multi-GPU pods."""
    total = sum(p.requested_milli for p in pods)
    if which == "share":
        part = sum(p.requested_milli for p in pods if p.shared)
    else:
        part = sum(p.requested_milli for p in pods if p.num_gpu >= 2)
    return part / total


def test_family_names_and_parsing() -> None:
    assert "gpushare100" in family_names() and "gpuspec33" in family_names()
    assert parse_family("multigpu30") == ("multigpu", 30)
    for bad in ("gpushare", "cpu50", "gpushare101", "default"):
        with pytest.raises(ValueError, match="unknown workload family"):
            parse_family(bad)


@pytest.mark.parametrize(("family", "which", "share"), [
    ("gpushare60", "share", 0.6),
    ("gpushare100", "share", 1.0),
    ("multigpu40", "multi", 0.4),
])  # fmt: skip
def test_resampled_families_hit_their_share(family: str, which: str, share: float) -> None:
    pods = base_pods()
    derived = derive(family, pods, cluster_nodes(), seed=0)
    assert gpu_of(derived, which) == pytest.approx(share, abs=0.03)
    total = sum(p.requested_milli for p in pods)
    # Each group stops at its target: the total overshoots by less than two pods.
    biggest = max(p.requested_milli for p in pods)
    assert total <= sum(p.requested_milli for p in derived) < total + 2 * biggest
    # CPU-only pods are kept as they are; names are unique.
    assert sum(1 for p in derived if p.num_gpu == 0) == 10
    assert len({p.name for p in derived}) == len(derived)
    assert derived == derive(family, pods, cluster_nodes(), seed=0)
    assert derived != derive(family, pods, cluster_nodes(), seed=1)


def test_gpuspec_constrains_a_fraction_to_hosting_models() -> None:
    pods = base_pods()
    nodes = cluster_nodes()
    derived = derive("gpuspec33", pods, nodes, seed=0)
    gpu_pods = [p for p in derived if p.num_gpu > 0]
    constrained = [p for p in gpu_pods if p.gpu_models]
    assert len(constrained) == round(0.33 * len(gpu_pods))
    assert not any(p.gpu_models for p in derived if p.num_gpu == 0)
    for p in constrained:
        # Each allowed model has a node that could host the pod when empty.
        assert all(
            any(n.gpu_model == m and n.gpus >= p.num_gpu and n.cpu_milli >= p.cpu_milli
                for n in nodes)
            for m in p.gpu_models
        )  # fmt: skip
    # The 8-GPU pods can only be on G2.
    assert all(p.gpu_models == {"G2"} for p in constrained if p.num_gpu == 8)
    # Resources are untouched: only the model list changes.
    assert [(p.num_gpu, p.cpu_milli) for p in derived] == [(p.num_gpu, p.cpu_milli) for p in pods]


def test_written_family_loads_back(tmp_path: Path) -> None:
    derived = derive("gpuspec20", base_pods(), cluster_nodes(), seed=3)
    path = tmp_path / "gpuspec20.csv"
    write_pods(path, derived)
    assert load_pods(path) == derived
