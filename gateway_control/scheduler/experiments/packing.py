"""The packing experiment of "Beware of Fragmentation" (ATC'23), on the openb trace.

Cluster: the node list. Workload: every pod plus seeded random duplicates until the
requested GPUs reach `inflation` x capacity, shuffled with the same seed. Pods arrive one
at a time, never leave, and fail when they fit nowhere. After each whole percent of
arrived workload (requested GPUs of arrived pods / capacity) the allocated and the
fragmented GPU, as percentages of capacity, are recorded.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from gateway_control.scheduler.cluster import Cluster, Node, Pod
from gateway_control.scheduler.fragmentation import Fragmentation, target_workload
from gateway_control.scheduler.policies.registry import make_policy

INFLATION = 1.3


def build_workload(
    pods: Sequence[Pod], capacity_milli: int, seed: int, inflation: float = INFLATION
) -> list[Pod]:
    """All pods plus seeded random duplicates until their GPU requests reach
    `inflation` x capacity, in a seeded random order."""
    rng = random.Random(seed)
    workload = list(pods)
    requested = sum(p.requested_milli for p in workload)
    target = round(inflation * capacity_milli)
    if requested < target and not any(p.requested_milli for p in pods):
        raise ValueError("no pod requests a GPU: the workload cannot reach its target")
    copies = 0
    while requested < target:
        pod = rng.choice(pods)
        copies += 1
        workload.append(replace(pod, name=f"{pod.name}-dup{copies}"))
        requested += pod.requested_milli
    rng.shuffle(workload)
    return workload


@dataclass(frozen=True, slots=True)
class PackingResult:
    """One run: the two curves (index = percent of arrived workload) and counters."""

    policy: str
    seed: int
    total_gpus: int
    allocated_gpu_pct: tuple[float, ...]
    fragmented_gpu_pct: tuple[float, ...]
    pods: int
    failed: int
    placement_seconds: float  # time spent in the policy's choose()

    def to_json(self) -> dict[str, Any]:
        """The experiment's output document."""
        return {
            "policy": self.policy,
            "seed": self.seed,
            "total_gpus": self.total_gpus,
            "allocated_gpu_pct": list(self.allocated_gpu_pct),
            "fragmented_gpu_pct": list(self.fragmented_gpu_pct),
        }


def run_packing(
    nodes: Sequence[Node],
    pods: Sequence[Pod],
    policy_name: str,
    seed: int,
    inflation: float = INFLATION,
) -> PackingResult:
    """Run the experiment once. `nodes` are copied empty; the target workload for the
    fragmentation measure (and for `fgd`) is the popularity of the pod list's shapes."""
    cluster = Cluster([node.emptied() for node in nodes])
    capacity = cluster.capacity_milli
    if capacity == 0:
        raise ValueError("the cluster has no GPU")
    shapes = target_workload(pods)
    measure = Fragmentation(shapes)
    node_frag = [measure.of_node(node) for node in cluster.nodes]
    cluster_frag = sum(node_frag)
    policy = make_policy(policy_name, seed, shapes)
    policy.bind(cluster)
    workload = build_workload(pods, capacity, seed, inflation)

    points = round(inflation * 100) + 1
    allocated = [0.0] * points
    fragmented = [0.0] * points

    def record(percent: int) -> None:
        allocated[percent] = round(100 * cluster.allocated_milli / capacity, 4)
        fragmented[percent] = round(100 * cluster_frag / capacity, 4)

    record(0)
    next_percent = 1
    arrived = 0
    failed = 0
    choosing = 0.0
    for pod in workload:
        arrived += pod.requested_milli
        started = time.perf_counter()
        placement = policy.choose(pod)
        choosing += time.perf_counter() - started
        if placement is None:
            failed += 1
        else:
            cluster.place(pod, placement)
            policy.placed(pod, placement)
            node = cluster.nodes[placement.node]
            frag = measure.of_node(node)
            cluster_frag += frag - node_frag[placement.node]
            node_frag[placement.node] = frag
        # Integer test: arrived / capacity >= percent / 100.
        while next_percent < points and arrived * 100 >= next_percent * capacity:
            record(next_percent)
            next_percent += 1
    while next_percent < points:  # only if the workload stopped short by rounding
        record(next_percent)
        next_percent += 1
    return PackingResult(
        policy=policy_name,
        seed=seed,
        total_gpus=capacity // 1000,
        allocated_gpu_pct=tuple(allocated),
        fragmented_gpu_pct=tuple(fragmented),
        pods=len(workload),
        failed=failed,
        placement_seconds=choosing,
    )
