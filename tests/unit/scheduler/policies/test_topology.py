"""Topology-aware placement: domains, whole-node reservation, gangs within one domain."""

from __future__ import annotations

import pytest

from gateway_control.scheduler.cluster import Cluster, Node, Placement, Pod
from gateway_control.scheduler.fragmentation import target_workload
from gateway_control.scheduler.policies.topology import TopologyAware, is_empty, node_domains


def node(name: str, gpus: int = 8, model: str = "G2", domain: str = "") -> Node:
    return Node(name, gpus, model, cpu_milli=96000, memory_mib=393216, domain=domain)


def pod(num_gpu: int = 1, milli: int = 1000, cpu: int = 4000, name: str = "p") -> Pod:
    return Pod(name, num_gpu, milli if num_gpu else 0, cpu, 8192)


def bound(nodes: list[Node], rack_size: int = 8, large_gpus: int = 4) -> TopologyAware:
    policy = TopologyAware(target_workload([pod(), pod(milli=500)]), rack_size, large_gpus)
    policy.bind(Cluster(nodes))
    return policy


def place(policy: TopologyAware, p: Pod, placement: Placement) -> None:
    policy.cluster.place(p, placement)
    policy.placed(p, placement)


def test_domains_are_racks_of_consecutive_nodes_unless_named() -> None:
    nodes = [node(str(i)) for i in range(5)] + [node("x", domain="nvl-0")]
    assert node_domains(nodes, 2) == ["rack-0", "rack-0", "rack-1", "rack-1", "rack-2", "nvl-0"]
    with pytest.raises(ValueError):
        node_domains(nodes, 0)


def test_large_job_only_on_an_otherwise_empty_node() -> None:
    nodes = [node("used"), node("empty")]
    nodes[0].place(pod(milli=100), (0,))  # one tenth of one GPU in use
    policy = bound(nodes)
    # Six whole GPUs fit on both; more than four GPUs is large: the empty node only.
    assert policy.choose(pod(num_gpu=6)) == Placement(1, (0, 1, 2, 3, 4, 5))
    # Four GPUs is not large on an 8-GPU node: fragmentation decides (the used node,
    # which keeps the empty one whole).
    assert policy.choose(pod(num_gpu=4)).node == 0  # type: ignore[union-attr]
    # CPU alone makes a node non-empty too.
    nodes[1].place(pod(num_gpu=0, cpu=1000), ())
    policy = bound(nodes)
    assert policy.choose(pod(num_gpu=6)) is None


def test_all_gpus_of_a_small_node_is_large_there() -> None:
    nodes = [node("t4-used", gpus=2, model="T4"), node("t4-empty", gpus=2, model="T4")]
    nodes[0].place(pod(num_gpu=0, cpu=2000), ())  # CPU in use, both GPUs free
    assert bound(nodes).choose(pod(num_gpu=2)) == Placement(1, (0, 1))


def test_a_share_of_a_gpu_is_never_large() -> None:
    one_gpu = node("v100", gpus=1, model="V100M16")
    one_gpu.place(pod(num_gpu=0, cpu=1000), ())
    policy = bound([one_gpu])
    assert policy.choose(pod(milli=500)) == Placement(0, (0,))  # not empty, still fine
    assert policy.choose(pod()) is None  # the whole GPU is all the node has: large


def test_a_held_node_takes_nothing_else_until_released() -> None:
    nodes = [node("a"), node("b", gpus=2, model="T4")]
    policy = bound(nodes)
    big = pod(num_gpu=6)
    placement = policy.choose(big)
    assert placement == Placement(0, (0, 1, 2, 3, 4, 5))
    place(policy, big, placement)
    # Node a still has two GPUs and plenty of CPU, but it is held: the T4 node.
    assert policy.choose(pod()) == Placement(1, (0,))
    assert policy.choose(pod(num_gpu=0)).node == 1  # type: ignore[union-attr]
    policy.cluster.unplace(big, placement)
    policy.released(big, placement)
    assert is_empty(nodes[0])
    assert policy.choose(pod(num_gpu=8)) == Placement(0, tuple(range(8)))


def test_gang_goes_to_one_node_when_it_can() -> None:
    nodes = [node("a"), node("b")]
    policy = bound(nodes, rack_size=1)
    members = policy.choose_gang(pod(num_gpu=8, cpu=64000))
    assert members is not None and len(members) == 1
    assert members[0].placement == Placement(0, tuple(range(8)))


def test_gang_spans_empty_nodes_of_one_domain_only() -> None:
    # Racks of two: rack-0 = {a, b}, b partly used; rack-1 = {c, d}; rack-2 = {e}.
    nodes = [node("a"), node("b"), node("c"), node("d"), node("e")]
    nodes[1].place(pod(milli=100), (0,))
    policy = bound(nodes, rack_size=2)
    job = pod(num_gpu=16, cpu=64000, name="job")
    members = policy.choose_gang(job)
    assert members is not None
    assert [m.placement for m in members] == [
        Placement(2, tuple(range(8))),
        Placement(3, tuple(range(8))),
    ]
    assert [(m.pod.name, m.pod.num_gpu, m.pod.cpu_milli) for m in members] == [
        ("job/0", 8, 32000),
        ("job/1", 8, 32000),
    ]
    for m in members:
        place(policy, m.pod, m.placement)
    # No rack has two empty nodes left: a and e are empty but in different racks.
    assert policy.choose_gang(job) is None


def test_gang_prefers_the_domain_it_fills_best() -> None:
    # rack-0: three empty 8-GPU nodes; rack-1: two. A 12-GPU job fits both: rack-1 keeps
    # rack-0 whole for a bigger job. Its members: one whole node and four GPUs of another.
    nodes = [node(f"r0-{i}", domain="r0") for i in range(3)]
    nodes += [node(f"r1-{i}", domain="r1") for i in range(2)]
    members = bound(nodes).choose_gang(pod(num_gpu=12, cpu=24000))
    assert members is not None
    assert [(m.placement.node, m.pod.num_gpu, m.pod.cpu_milli) for m in members] == [
        (3, 8, 16000),
        (4, 4, 8000),
    ]


def test_gang_refuses_shared_pods_and_wrong_models() -> None:
    nodes = [node("a", gpus=1), node("b", gpus=1)]
    policy = bound(nodes, rack_size=2)
    for p in (
        Pod("x", 1, 500, 1000, 1024, frozenset({"T4"})),
        Pod("y", 2, 1000, 1000, 1024, frozenset({"T4"})),
    ):
        assert policy.choose_gang(p) is None
    assert policy.choose_gang(pod(num_gpu=2)) is not None
