"""Nodes, pods, a policy's choice and a synthetic openb slice, for the packing tests."""

from __future__ import annotations

from pathlib import Path

from gateway_control.scheduler.cluster import Cluster, Node, Placement, Pod
from gateway_control.scheduler.fragmentation import target_workload
from gateway_control.scheduler.policies.registry import make_policy

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
