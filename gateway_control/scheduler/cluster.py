"""GPU cluster model for placement: nodes, pods, fit checks and the bookkeeping of a placement.

Pure: the CSV loaders take a path, everything else works on memory. Units follow the
Alibaba openb trace: CPU in milli-cores, memory in MiB, GPU in thousandths of one GPU.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

GPU_MILLI = 1000  # one whole GPU


@dataclass(slots=True, eq=False)
class Node:
    """One GPU server and what is still free on it (mutable: placements change it)."""

    name: str
    gpus: int
    gpu_model: str
    cpu_milli: int
    memory_mib: int
    gpu_free: list[int] = field(default_factory=list)  # per GPU, 0..1000
    cpu_free: int = -1
    memory_free: int = -1
    domain: str = ""
    healthy: bool = True

    def __post_init__(self) -> None:
        # A fresh node is empty unless the caller says otherwise.
        if not self.gpu_free:
            self.gpu_free = [GPU_MILLI] * self.gpus
        if self.cpu_free < 0:
            self.cpu_free = self.cpu_milli
        if self.memory_free < 0:
            self.memory_free = self.memory_mib

    def emptied(self) -> Node:
        """A node like this one with nothing placed on it."""
        return Node(
            name=self.name,
            gpus=self.gpus,
            gpu_model=self.gpu_model,
            cpu_milli=self.cpu_milli,
            memory_mib=self.memory_mib,
            domain=self.domain,
            healthy=self.healthy,
        )

    @property
    def gpu_free_milli(self) -> int:
        """Idle GPU on the node, in thousandths of a GPU."""
        return sum(self.gpu_free)

    def place(self, pod: Pod, gpus: Sequence[int]) -> None:
        """Take `pod`'s resources, its GPU share from each GPU index in `gpus`."""
        per_gpu = pod.per_gpu_milli
        for index in gpus:
            if self.gpu_free[index] < per_gpu:
                raise ValueError(f"{pod.name}: GPU {index} of {self.name} has too little free")
        for index in gpus:
            self.gpu_free[index] -= per_gpu
        self.cpu_free -= pod.cpu_milli
        self.memory_free -= pod.memory_mib

    def unplace(self, pod: Pod, gpus: Sequence[int]) -> None:
        """Give back what `place(pod, gpus)` took."""
        per_gpu = pod.per_gpu_milli
        for index in gpus:
            self.gpu_free[index] += per_gpu
        self.cpu_free += pod.cpu_milli
        self.memory_free += pod.memory_mib


@dataclass(frozen=True, slots=True)
class Pod:
    """One task's request. `gpu_milli` is the share of one GPU for a GPU-sharing pod
    (num_gpu == 1, gpu_milli < 1000); pods with num_gpu >= 1 otherwise take whole GPUs."""

    name: str
    num_gpu: int
    gpu_milli: int
    cpu_milli: int
    memory_mib: int
    gpu_models: frozenset[str] = frozenset()  # allowed models; empty: any

    @property
    def shared(self) -> bool:
        """True for a pod that takes a fraction of one GPU."""
        return self.num_gpu == 1 and 0 < self.gpu_milli < GPU_MILLI

    @property
    def per_gpu_milli(self) -> int:
        """What the pod takes from each of its GPUs."""
        if self.num_gpu == 0:
            return 0
        return self.gpu_milli if self.shared else GPU_MILLI

    @property
    def requested_milli(self) -> int:
        """Total GPU requested, in thousandths of a GPU (what the arrival axis counts)."""
        return self.num_gpu * self.per_gpu_milli

    def allows(self, gpu_model: str) -> bool:
        """Whether the pod may run on this GPU model."""
        return not self.gpu_models or gpu_model in self.gpu_models

    def fits(self, node: Node) -> bool:
        """Whether `node` can host the pod now (CPU, memory, GPU model and GPU share)."""
        if not node.healthy or node.cpu_free < self.cpu_milli or node.memory_free < self.memory_mib:
            return False
        if self.num_gpu == 0:
            return True
        if not self.allows(node.gpu_model):
            return False
        per_gpu = self.per_gpu_milli
        if self.num_gpu == 1:
            return max(node.gpu_free, default=0) >= per_gpu
        return sum(1 for free in node.gpu_free if free >= per_gpu) >= self.num_gpu

    def gpu_choice(self, node: Node) -> tuple[int, ...]:
        """The GPUs a pod takes on a node that fits it when the policy has no opinion:
        the tightest GPU for a shared pod (keeps whole GPUs whole), else the first free ones."""
        if self.num_gpu == 0:
            return ()
        per_gpu = self.per_gpu_milli
        if self.shared:
            best = -1
            for index, free in enumerate(node.gpu_free):
                if free >= per_gpu and (best < 0 or free < node.gpu_free[best]):
                    best = index
            return (best,) if best >= 0 else ()
        chosen = [i for i, free in enumerate(node.gpu_free) if free >= per_gpu]
        return tuple(chosen[: self.num_gpu])


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a pod went: the node's index in the cluster and the GPU indices on it."""

    node: int
    gpus: tuple[int, ...]


class Cluster:
    """The nodes, and the GPU allocated across them (kept current by `place`)."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.nodes = list(nodes)
        self.capacity_milli = sum(node.gpus for node in self.nodes) * GPU_MILLI
        self.allocated_milli = sum(n.gpus * GPU_MILLI - n.gpu_free_milli for n in self.nodes)

    def place(self, pod: Pod, placement: Placement) -> None:
        """Bind `pod` where `placement` says."""
        self.nodes[placement.node].place(pod, placement.gpus)
        self.allocated_milli += pod.requested_milli

    def unplace(self, pod: Pod, placement: Placement) -> None:
        """Undo `place(pod, placement)`."""
        self.nodes[placement.node].unplace(pod, placement.gpus)
        self.allocated_milli -= pod.requested_milli


def load_nodes(path: str | Path) -> list[Node]:
    """Nodes from an openb node list (columns sn,cpu_milli,memory_mib,gpu,model)."""
    with open(path, newline="") as f:
        return [
            Node(
                name=row["sn"],
                gpus=int(row["gpu"]),
                gpu_model=row["model"],
                cpu_milli=int(row["cpu_milli"]),
                memory_mib=int(row["memory_mib"]),
            )
            for row in csv.DictReader(f)
        ]


def load_pods(path: str | Path) -> list[Pod]:
    """Pods from an openb pod list (name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,...).

    num_gpu == 0 is a CPU-only pod: it takes CPU and memory and no GPU. A multi-GPU pod
    takes whole GPUs whatever its gpu_milli says.
    """
    pods = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            num_gpu = int(row["num_gpu"])
            gpu_milli = int(row["gpu_milli"] or 0)
            if num_gpu == 0:
                gpu_milli = 0
            elif num_gpu > 1 or gpu_milli <= 0 or gpu_milli > GPU_MILLI:
                gpu_milli = GPU_MILLI
            spec = row.get("gpu_spec") or ""
            pods.append(
                Pod(
                    name=row["name"],
                    num_gpu=num_gpu,
                    gpu_milli=gpu_milli,
                    cpu_milli=int(row["cpu_milli"]),
                    memory_mib=int(row["memory_mib"]),
                    gpu_models=frozenset(m for m in spec.split("|") if m),
                )
            )
    return pods
