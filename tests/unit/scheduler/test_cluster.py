"""gateway_control.scheduler.cluster: fit checks (model, CPU, memory, GPU shares) and
the CSV loaders."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway_control.scheduler.cluster import load_nodes, load_pods
from tests.unit.scheduler.packing_helpers import NODE_HEADER, POD_HEADER, node, pod


def test_gpu_model_allowed_list() -> None:
    assert pod(models="V100M16|A10").fits(node(model="A10"))
    assert not pod(models="V100M16|A10").fits(node(model="T4"))
    assert pod().fits(node(model="T4"))  # empty list: any model


def test_cpu_and_memory_limits() -> None:
    n = node(cpu=4000)
    assert pod(cpu=4000).fits(n)
    assert not pod(cpu=4001).fits(n)
    assert not pod(mem=65537).fits(n)
    cpu_only = pod(num_gpu=0, milli=0, cpu=3000)
    n.place(cpu_only, ())
    assert (n.cpu_free, n.gpu_free) == (1000, [1000, 1000])  # CPU taken, GPUs untouched
    assert not pod(cpu=1001).fits(n)


def test_sharing_within_one_gpu() -> None:
    n = node(gpus=2)
    share = pod(milli=600)
    assert share.shared and share.requested_milli == 600
    n.place(share, (0,))
    assert n.gpu_free == [400, 1000]
    assert share.gpu_choice(n) == (1,)  # 600 no longer fits on GPU 0
    assert pod(milli=400).gpu_choice(n) == (0,)  # the tightest GPU that fits
    n.place(share, (1,))
    assert not share.fits(n)  # 400 + 400 free, but never split across GPUs
    n.unplace(share, (1,))
    assert n.gpu_free == [400, 1000]


def test_multi_gpu_takes_whole_gpus() -> None:
    n = node(gpus=4)
    two = pod(num_gpu=2, milli=1000)
    assert not two.shared and two.requested_milli == 2000
    n.place(pod(milli=100), (0,))
    assert two.fits(n)
    assert two.gpu_choice(n) == (1, 2)
    n.place(two, (1, 2))
    assert n.gpu_free == [900, 0, 0, 1000]
    assert not two.fits(n)  # 1.9 GPUs free, only one whole
    with pytest.raises(ValueError):
        n.place(two, (0, 3))


def test_loaders(tmp_path: Path) -> None:
    nodes_csv = tmp_path / "nodes.csv"
    nodes_csv.write_text(NODE_HEADER + "a,64000,262144,2,P100\nb,96000,393216,8,G2\n")
    pods_csv = tmp_path / "pods.csv"
    pods_csv.write_text(
        POD_HEADER
        + "p0,12000,16384,1,460,,LS,Running,0,1,0\n"
        + "p1,8000,1024,0,0,,BE,Running,0,1,0\n"
        + "p2,88000,1024,8,1000,V100M32|G2,LS,Running,0,1,\n"
    )
    a, b = load_nodes(nodes_csv)
    assert (a.name, a.gpus, a.gpu_model, a.gpu_free, a.cpu_free) == (
        "a",
        2,
        "P100",
        [1000] * 2,
        64000,
    )
    assert b.memory_free == 393216
    p0, p1, p2 = load_pods(pods_csv)
    assert p0.shared and p0.per_gpu_milli == 460 and not p0.gpu_models
    assert p1.num_gpu == 0 and p1.requested_milli == 0
    assert p2.requested_milli == 8000 and p2.gpu_models == {"V100M32", "G2"}
