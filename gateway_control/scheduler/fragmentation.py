"""GPU fragmentation relative to a target workload (Weng et al., "Beware of Fragmentation", ATC'23).

For each typical pod shape, weighted by its popularity: when the node cannot host the
shape at all, all its idle GPU is fragmented for that shape; when it can, the GPUs whose
free share is smaller than the shape's per-GPU request are. A node's fragmentation is the
weighted sum, the cluster's the sum over nodes. Amounts are in thousandths of a GPU.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gateway_control.scheduler.cluster import Node, Pod

# Node state as far as fragmentation cares: GPU model, sorted free shares, and the CPU and
# memory bands (how many shape thresholds the free amount reaches).
StateKey = tuple[str, tuple[int, ...], int, int]


@dataclass(frozen=True, slots=True)
class Shape:
    """One typical pod shape of the target workload and its popularity (weights sum to 1)."""

    num_gpu: int
    per_gpu_milli: int
    cpu_milli: int
    memory_mib: int
    gpu_models: frozenset[str]
    weight: float


def target_workload(pods: Iterable[Pod], with_memory: bool = True) -> tuple[Shape, ...]:
    """The shapes of the GPU-requesting pods, weighted by how many pods have each.

    A shape is GPU count, per-GPU share, CPU, memory (unless `with_memory` is false) and
    allowed models. CPU-only pods are left out: they neither use idle GPU nor are blocked
    by its layout, so they say nothing about which GPU is fragmented.
    """
    counts = Counter(
        (p.num_gpu, p.per_gpu_milli, p.cpu_milli, p.memory_mib if with_memory else 0, p.gpu_models)
        for p in pods
        if p.num_gpu > 0
    )
    total = sum(counts.values())
    return tuple(
        Shape(num_gpu, per_gpu, cpu, memory, models, count / total)
        for (num_gpu, per_gpu, cpu, memory, models), count in counts.most_common()
    )


class Fragmentation:
    """Fragmentation of node states for one target workload, memoised by state.

    Many nodes share a state (same model, same free shares up to order, CPU and memory in
    the same band between shape thresholds), so a placement search mostly hits the memo.
    """

    def __init__(self, shapes: Sequence[Shape]) -> None:
        self.shapes = tuple(shapes)
        self._cpu_thresholds = sorted({s.cpu_milli for s in self.shapes})
        self._memory_thresholds = sorted({s.memory_mib for s in self.shapes})
        self._memo: dict[StateKey, float] = {}

    def of_state(
        self, gpu_model: str, sorted_free: tuple[int, ...], cpu_free: int, memory_free: int
    ) -> float:
        """Fragmented GPU (milli) of a node in this state; `sorted_free` ascending."""
        key = (
            gpu_model,
            sorted_free,
            bisect_right(self._cpu_thresholds, cpu_free),
            bisect_right(self._memory_thresholds, memory_free),
        )
        frag = self._memo.get(key)
        if frag is None:
            frag = self._compute(gpu_model, sorted_free, cpu_free, memory_free)
            self._memo[key] = frag
        return frag

    def of_node(self, node: Node) -> float:
        """Fragmented GPU (milli) of `node` as it is now."""
        return self.of_state(
            node.gpu_model, tuple(sorted(node.gpu_free)), node.cpu_free, node.memory_free
        )

    def _compute(
        self, gpu_model: str, sorted_free: tuple[int, ...], cpu_free: int, memory_free: int
    ) -> float:
        idle = sum(sorted_free)
        if idle == 0:
            return 0.0
        largest = sorted_free[-1]
        whole = sum(1 for free in sorted_free if free >= 1000)
        frag = 0.0
        for shape in self.shapes:
            hostable = (
                cpu_free >= shape.cpu_milli
                and memory_free >= shape.memory_mib
                and (not shape.gpu_models or gpu_model in shape.gpu_models)
            )
            if hostable:
                if shape.num_gpu == 1:
                    hostable = largest >= shape.per_gpu_milli
                else:
                    hostable = whole >= shape.num_gpu
            if hostable:
                frag += shape.weight * sum(f for f in sorted_free if f < shape.per_gpu_milli)
            else:
                frag += shape.weight * idle
        return frag
