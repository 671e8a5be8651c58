"""GPU packing core: model constraints, policies, fragmentation, the packing experiment."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.scheduler.cluster import Cluster, Node, Placement, Pod, load_nodes, load_pods
from gateway.scheduler.experiments.packing import build_workload, run_packing
from gateway.scheduler.fragmentation import Fragmentation, Shape, target_workload
from gateway.scheduler.policies.fgd import FragmentationGradient
from gateway.scheduler.policies.registry import POLICY_NAMES, make_policy

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"
POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time\n"
)


def node(name: str = "n", gpus: int = 2, model: str = "T4", cpu: int = 32000) -> Node:
    return Node(name=name, gpus=gpus, gpu_model=model, cpu_milli=cpu, memory_mib=65536)


def pod(
    num_gpu: int = 1, milli: int = 1000, cpu: int = 1000, mem: int = 1024, models: str = ""
) -> Pod:
    allowed = frozenset(m for m in models.split("|") if m)
    return Pod("p", num_gpu, milli, cpu, mem, allowed)


def choose(name: str, nodes: list[Node], p: Pod, seed: int = 0) -> Placement | None:
    policy = make_policy(name, seed, target_workload([p]))
    policy.bind(Cluster(nodes))
    return policy.choose(p)


# --- model -----------------------------------------------------------------------------


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


# --- policies --------------------------------------------------------------------------


def test_first_fit_picks_the_first() -> None:
    nodes = [node("a", cpu=500), node("b"), node("c")]
    assert choose("first-fit", nodes, pod()) == Placement(1, (0,))


def test_best_fit_picks_the_tightest() -> None:
    nodes = [node("a"), node("b"), node("c")]
    nodes[1].place(pod(milli=500), (0,))
    nodes[2].place(pod(milli=300), (1,))
    # b keeps 500 + 1000 free after a 500 share: the least left.
    assert choose("best-fit", nodes, pod(milli=500)) == Placement(1, (0,))
    # A whole GPU: c would keep 700, b 500: b.
    assert choose("best-fit", nodes, pod()) == Placement(1, (1,))


def test_random_is_reproducible_by_seed() -> None:
    def run(seed: int) -> list[Placement | None]:
        nodes = [node(str(i), gpus=4) for i in range(20)]
        policy = make_policy("random", seed, ())
        cluster = Cluster(nodes)
        policy.bind(cluster)
        out: list[Placement | None] = []
        for _ in range(30):
            p = pod(milli=300)
            placement = policy.choose(p)
            assert placement is not None
            cluster.place(p, placement)
            out.append(placement)
        return out

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_no_fit_anywhere() -> None:
    for name in POLICY_NAMES:
        assert choose(name, [node(gpus=2)], pod(num_gpu=4)) is None, name


def test_unknown_policy() -> None:
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("worst-fit", 0, ())


# --- fragmentation ---------------------------------------------------------------------

HALF_AND_WHOLE = (
    Shape(1, 500, 0, 0, frozenset(), 0.5),
    Shape(1, 1000, 0, 0, frozenset(), 0.5),
)


@pytest.mark.parametrize(
    ("free", "cpu", "expected"),
    [
        ((300, 1000), 1000, 300.0),  # both shapes fit; only the 300 GPU is fragmented
        ((600, 1000), 1000, 0.5 * 600),  # 600 serves the 500 shape, not the whole one
        ((300, 400), 1000, 700.0),  # nothing fits: all idle GPU for both shapes
        ((0, 0), 1000, 0.0),
        ((600, 700), 1000, 0.5 * 0 + 0.5 * 1300),  # half fits everywhere; whole nowhere
    ],
)
def test_fragmentation_hand_computed(free: tuple[int, int], cpu: int, expected: float) -> None:
    assert Fragmentation(HALF_AND_WHOLE).of_state("T4", free, cpu, 0) == pytest.approx(expected)


def test_fragmentation_counts_cpu_and_model_and_multi_gpu() -> None:
    shapes = (
        Shape(2, 1000, 8000, 0, frozenset(), 0.25),
        Shape(1, 250, 0, 0, frozenset({"A10"}), 0.75),
    )
    frag = Fragmentation(shapes)
    # Two whole GPUs and enough CPU: the two-GPU shape sees the 200 as fragmented;
    # the A10-only shape cannot run on a T4: all 2200 idle.
    assert frag.of_state("T4", (200, 1000, 1000), 8000, 0) == pytest.approx(
        0.25 * 200 + 0.75 * 2200
    )
    # Too little CPU for the two-GPU shape: all idle for it too.
    assert frag.of_state("T4", (200, 1000, 1000), 7999, 0) == pytest.approx(2200)
    # On an A10 the 250 shape fits; of its GPUs only the 200 one is too small for it.
    assert frag.of_state("A10", (200, 1000, 1000), 8000, 0) == pytest.approx(200)


def test_fragmentation_counts_memory() -> None:
    frag = Fragmentation((Shape(1, 500, 0, 4096, frozenset(), 1.0),))
    assert frag.of_state("T4", (300, 1000), 0, 4096) == pytest.approx(300)
    assert frag.of_state("T4", (300, 1000), 0, 4095) == pytest.approx(1300)


def test_target_workload_weights_by_popularity() -> None:
    pods = [pod(milli=500)] * 3 + [pod()] + [pod(num_gpu=0, milli=0)] * 5
    shapes = target_workload(pods)
    assert [(s.per_gpu_milli, s.weight) for s in shapes] == [(500, 0.75), (1000, 0.25)]


def test_fgd_prefers_the_placement_that_fragments_least() -> None:
    # Target: half-GPU pods. A 500 share on the node with a 500 hole fills it (the node's
    # fragmentation stays 0); on a fresh node it would leave 500 usable, also 0; on the
    # node with 700 free it leaves a 200 fragment.
    nodes = [node("a", gpus=1), node("b", gpus=1), node("c", gpus=1)]
    nodes[0].place(pod(milli=300), (0,))
    nodes[1].place(pod(milli=500), (0,))
    shapes = (Shape(1, 500, 0, 0, frozenset(), 1.0),)
    policy = FragmentationGradient(shapes)
    policy.bind(Cluster(nodes))
    assert policy.choose(pod(milli=500)) == Placement(1, (0,))
    # A 200 share: on a (700 free) it leaves 500, no fragment; on b a 300 fragment; on c
    # an 800 GPU, no fragment either. The tie between a and c goes to the tighter a.
    assert policy.choose(pod(milli=200)) == Placement(0, (0,))


def test_fgd_near_ties_go_to_best_fit() -> None:
    shapes = (Shape(1, 500, 0, 0, frozenset(), 0.995), Shape(1, 100, 3000, 0, frozenset(), 0.005))
    roomy, tight = node("x", gpus=1, cpu=32000), node("t", gpus=1, cpu=4000)
    p = pod(milli=500, cpu=2000)
    # On t the pod leaves 2000 CPU, too little for the small shape: +2.5 fragmentation;
    # on x, +0. Within the tolerance that is a tie, and t is the tighter node.
    exact = FragmentationGradient(shapes, tolerance_milli=0)
    exact.bind(Cluster([roomy, tight]))
    assert exact.choose(p) == Placement(0, (0,))
    tolerant = FragmentationGradient(shapes)
    tolerant.bind(Cluster([roomy, tight]))
    assert tolerant.choose(p) == Placement(1, (0,))


# --- the experiment --------------------------------------------------------------------


def write_slice(tmp_path: Path) -> tuple[Path, Path]:
    nodes_csv = tmp_path / "nodes.csv"
    rows = [
        f"n{i},{32000 + 32000 * (i % 2)},131072,{(2, 4, 8)[i % 3]},{('T4', 'G2')[i % 2]}"
        for i in range(12)
    ]
    nodes_csv.write_text(NODE_HEADER + "\n".join(rows) + "\n")
    pods_csv = tmp_path / "pods.csv"
    shapes = [
        (4000, 1, 1000, ""),
        (4000, 1, 500, ""),
        (2000, 1, 250, ""),
        (8000, 2, 1000, ""),
        (16000, 0, 0, ""),
        (6000, 1, 810, "G2"),
        (24000, 4, 1000, ""),
    ]
    lines = [
        f"p{i},{cpu},8192,{num},{milli},{spec},LS,Running,0,1,0"
        for i, (cpu, num, milli, spec) in enumerate(shapes * 4)
    ]
    pods_csv.write_text(POD_HEADER + "\n".join(lines) + "\n")
    return nodes_csv, pods_csv


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


def test_cli_prints_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    nodes_csv, pods_csv = write_slice(tmp_path)
    argv = ["simulate", "packing", "--nodes", str(nodes_csv), "--pods", str(pods_csv)]
    assert main([*argv, "--seed", "5", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["policy"] == "fgd-plus" and doc["seed"] == 5 and len(doc["allocated_gpu_pct"]) == 131
    assert main([*argv, "--seed", "5", "--policy", "random"]) == 0
    assert "random seed 5" in capsys.readouterr().out
    assert (
        main(["simulate", "packing", "--nodes", "/nonexistent", "--pods", "x", "--seed", "1"]) == 2
    )
