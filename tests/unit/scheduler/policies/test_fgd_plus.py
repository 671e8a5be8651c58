"""`fgd-plus`: FGD plus stranded GPU (CPU/memory) and the price of restricted GPU models."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from gateway_control.scheduler.cluster import Cluster, Node, Placement, Pod, load_nodes, load_pods
from gateway_control.scheduler.experiments.packing import run_packing
from gateway_control.scheduler.experiments.workloads import derive
from gateway_control.scheduler.fragmentation import Shape, target_workload
from gateway_control.scheduler.policies.fgd import FragmentationGradient
from gateway_control.scheduler.policies.fgd_plus import (
    FragmentationGradientPlus,
    per_gpu_needs,
    restricted_demand,
)
from gateway_control.scheduler.policies.registry import BEST_POLICY, make_policy
from tests.unit.scheduler.packing_helpers import POD_HEADER

ANY: frozenset[str] = frozenset()


def node(name: str, gpus: int, cpu: int, model: str = "G2") -> Node:
    return Node(name, gpus, model, cpu_milli=cpu, memory_mib=1 << 20)


def bind(policy: FragmentationGradient, nodes: list[Node]) -> FragmentationGradient:
    policy.bind(Cluster(nodes))
    return policy


NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"


def test_workload_needs_per_gpu() -> None:
    shapes = (Shape(1, 1000, 10000, 4096, ANY, 0.5), Shape(1, 500, 2000, 1024, ANY, 0.5))
    cpu, memory = per_gpu_needs(shapes)
    assert cpu == pytest.approx((0.5 * 10000 + 0.5 * 2000) / 750)
    assert memory == pytest.approx((0.5 * 4096 + 0.5 * 1024) / 750)
    assert per_gpu_needs(()) == (0.0, 0.0)


def test_restricted_demand_splits_by_capacity() -> None:
    shapes = (
        Shape(1, 1000, 0, 0, ANY, 0.5),
        Shape(2, 1000, 0, 0, frozenset({"T4", "P100"}), 0.25),
        Shape(1, 1000, 0, 0, frozenset({"A100"}), 0.25),  # no A100 in the cluster
    )
    share = restricted_demand(shapes, {"T4": 6, "P100": 2, "G2": 8})
    total = 0.5 + 0.5 + 0.25  # GPU demand, popularity-weighted
    assert share["T4"] == pytest.approx(0.5 / total * 6 / 8)
    assert share["P100"] == pytest.approx(0.5 / total * 2 / 8)
    assert share["G2"] == 0.0


def test_cpu_only_pod_goes_where_cpu_strands_no_gpu() -> None:
    # The workload needs 10 cores per GPU. An 8-core CPU-only pod on the 24-core node
    # leaves 16 cores for 2 idle GPUs: 0.4 GPU stranded. On the 104-core node, nothing.
    # Either way every shape still fits, so FGD sees no change and best-fit picks the
    # tighter node; fgd-plus does not.
    shapes = (Shape(1, 1000, 10000, 0, ANY, 1.0),)
    nodes = [node("tight", 2, 24000), node("roomy", 2, 104000)]
    cpu_only = Pod("c", 0, 0, 8000, 1024)
    assert bind(FragmentationGradient(shapes), nodes).choose(cpu_only) == Placement(0, ())
    plus = bind(FragmentationGradientPlus(shapes), nodes)
    assert isinstance(plus, FragmentationGradientPlus)
    assert plus.stranded(2000, 16000, 1 << 20) == pytest.approx(400)
    assert plus.choose(cpu_only) == Placement(1, ())


def test_cpu_hungry_gpu_pod_goes_where_cpu_is() -> None:
    # A 30-core GPU pod on the 48-core 4-GPU node leaves 18 cores for 3 GPUs (1.2
    # stranded at 10 cores per GPU); on the 80-core 4-GPU node, 50 cores: none.
    shapes = (Shape(1, 1000, 10000, 0, ANY, 1.0),)
    nodes = [node("tight", 4, 48000), node("roomy", 4, 80000)]
    hungry = Pod("h", 1, 1000, 30000, 1024)
    assert bind(FragmentationGradient(shapes), nodes).choose(hungry) == Placement(0, (0,))
    assert bind(FragmentationGradientPlus(shapes), nodes).choose(hungry) == Placement(1, (0,))


def test_restricted_model_is_priced_by_how_full_it_is() -> None:
    # Every pod may run on T4 or P100 (half of the demand each, by capacity). The T4 node
    # has one idle GPU, the P100 node four: FGD sees no fragmentation either way and
    # best-fit fills the T4; fgd-plus keeps the T4's last GPU (the restricted demand still
    # to come wants 2.5 times what the T4 has idle, 0.6 times the P100's).
    models = frozenset({"T4", "P100"})
    shapes = (Shape(1, 1000, 1000, 0, models, 1.0),)
    nodes = [node("t4", 4, 64000, "T4"), node("p100", 4, 64000, "P100")]
    used = Pod("u", 3, 1000, 3000, 1024)
    nodes[0].place(used, (0, 1, 2))
    p = Pod("p", 1, 1000, 1000, 1024, models)
    assert bind(FragmentationGradient(shapes), nodes).choose(p) == Placement(0, (3,))
    assert bind(FragmentationGradientPlus(shapes), nodes).choose(p) == Placement(1, (0,))


def test_unrestricted_workload_pays_no_model_price() -> None:
    plus = FragmentationGradientPlus((Shape(1, 1000, 0, 0, ANY, 1.0),), stranding_weight=0)
    fgd = FragmentationGradient((Shape(1, 1000, 0, 0, ANY, 1.0),))
    nodes = [node("a", 2, 8000, "T4"), node("b", 4, 8000, "G2")]
    nodes[1].place(Pod("u", 1, 1000, 0, 0), (0,))
    p = Pod("p", 1, 1000, 1000, 1024)
    assert bind(plus, nodes).choose(p) == bind(fgd, nodes).choose(p)


def test_walk_yields_one_fitting_node_per_state() -> None:
    # The fast walk reads fit off the signature; it must agree with Pod.fits, skip
    # unhealthy nodes without hiding a healthy twin, and yield each state once.
    rng = random.Random(7)
    models = ("T4", "G2")
    for _ in range(50):
        nodes = [
            Node(str(i), rng.choice((1, 2, 4)), rng.choice(models), 8000, 16384) for i in range(12)
        ]
        for n in nodes:
            n.gpu_free = [rng.choice((0, 300, 1000)) for _ in range(n.gpus)]
            n.cpu_free = rng.choice((0, 4000, 8000))
            n.healthy = rng.random() > 0.2
        pod = Pod(
            "p",
            rng.choice((0, 1, 2)),
            rng.choice((300, 1000)),
            rng.choice((0, 4000)),
            1024,
            frozenset({rng.choice(models)}) if rng.random() < 0.3 else ANY,
        )
        policy = FragmentationGradientPlus(target_workload([pod]))
        policy.bind(Cluster(nodes))
        walked = list(policy.distinct(pod))
        first_fitting: dict[object, int] = {}
        for i, n in enumerate(nodes):
            if pod.fits(n):
                first_fitting.setdefault(policy.signatures[i], i)
        assert [i for i, _ in walked] == sorted(first_fitting.values())


def test_released_restores_the_caches() -> None:
    shapes = (Shape(1, 500, 1000, 0, ANY, 0.5), Shape(2, 1000, 4000, 0, ANY, 0.5))
    nodes = [node("a", 4, 32000), node("b", 2, 16000)]
    policy = FragmentationGradientPlus(shapes)
    cluster = Cluster(nodes)
    policy.bind(cluster)
    p = Pod("p", 2, 1000, 8000, 1024)
    placement = policy.choose(p)
    assert placement is not None
    cluster.place(p, placement)
    policy.placed(p, placement)
    assert policy.choose(p) != placement
    cluster.unplace(p, placement)
    policy.released(p, placement)
    assert policy.choose(p) == placement


def test_fgd_plus_is_the_default_policy() -> None:
    assert BEST_POLICY == "fgd-plus"
    assert isinstance(make_policy("fgd-plus", 0, ()), FragmentationGradientPlus)


@pytest.mark.parametrize("family", ["gpushare80", "multigpu40", "gpuspec33"])
@pytest.mark.parametrize("policy", ["fgd", "fgd-plus", "topology"])
def test_packing_on_derived_families(tmp_path: Path, family: str, policy: str) -> None:
    # A synthetic slice shaped like openb: 8-GPU G2 nodes with 12 cores per GPU, T4
    # nodes with CPU to spare, a few P100 nodes; sharing, whole, multi-GPU and CPU-only
    # pods.
    nodes_csv = tmp_path / "nodes.csv"
    rows = [f"g{i},96000,393216,8,G2" for i in range(6)]
    rows += [f"t{i},104000,524288,2,T4" for i in range(6)]
    rows += [f"p{i},16000,122880,2,P100" for i in range(4)]
    nodes_csv.write_text(NODE_HEADER + "\n".join(rows) + "\n")
    shapes = [(11000, 1, 1000), (3000, 1, 470), (4000, 1, 810), (16000, 0, 0), (64000, 8, 1000)]
    shapes += [(24000, 1, 1000), (3000, 1, 230), (8000, 2, 1000)]
    lines = [
        f"x{i},{cpu},16384,{num},{milli},,LS,Running,0,1,0"
        for i, (cpu, num, milli) in enumerate(shapes * 5)
    ]
    pods_csv = tmp_path / "pods.csv"
    pods_csv.write_text(POD_HEADER + "\n".join(lines) + "\n")
    nodes = load_nodes(nodes_csv)
    pods = derive(family, load_pods(pods_csv), nodes, seed=0)
    result = run_packing(nodes, pods, policy, seed=2)
    assert result.total_gpus == 68
    allocated = result.allocated_gpu_pct
    assert 50 < allocated[100] <= 100
    assert run_packing(nodes, pods, policy, seed=2).to_json() == result.to_json()
