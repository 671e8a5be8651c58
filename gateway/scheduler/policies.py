"""Placement policies: which node (and which GPUs on it) a pod goes to. Pure: no I/O.

A policy is bound to a cluster, asked to `choose` for one pod at a time, and told what
was `placed` so it can keep per-node caches current. Ties go to the lowest node index.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from gateway.scheduler.fragmentation import Fragmentation, Shape
from gateway.scheduler.model import GPU_MILLI, Cluster, Node, Placement, Pod


class Policy:
    """Base: binds to a cluster; subclasses implement `choose`."""

    name = ""

    def __init__(self) -> None:
        self.cluster = Cluster([])

    def bind(self, cluster: Cluster) -> None:
        """Start placing on `cluster` (whose nodes may already hold pods)."""
        self.cluster = cluster

    def choose(self, pod: Pod) -> Placement | None:
        """Where `pod` should go, or None when it fits nowhere."""
        raise NotImplementedError

    def placed(self, pod: Pod, placement: Placement) -> None:
        """Called after the cluster took `placement`; refreshes per-node caches."""


class FirstFit(Policy):
    """The first node, in list order, that fits."""

    name = "first-fit"

    def choose(self, pod: Pod) -> Placement | None:
        """The first fitting node, its GPUs chosen by `Pod.gpu_choice`."""
        for index, node in enumerate(self.cluster.nodes):
            if pod.fits(node):
                return Placement(index, pod.gpu_choice(node))
        return None


class RandomFit(Policy):
    """A node chosen uniformly among those that fit, from a seeded generator."""

    name = "random"

    def __init__(self, seed: int) -> None:
        super().__init__()
        self._rng = random.Random(seed)

    def choose(self, pod: Pod) -> Placement | None:
        """A random fitting node, its GPUs chosen by `Pod.gpu_choice`."""
        fitting = [i for i, node in enumerate(self.cluster.nodes) if pod.fits(node)]
        if not fitting:
            return None
        index = self._rng.choice(fitting)
        return Placement(index, pod.gpu_choice(self.cluster.nodes[index]))


def remaining_score(node: Node, pod: Pod) -> float:
    """Best-fit's measure: what the node has left after taking `pod`, as the sum of the
    free fractions of GPU, CPU and memory (each relative to the node's capacity)."""
    score = 0.0
    if node.gpus:
        score += (node.gpu_free_milli - pod.requested_milli) / (node.gpus * GPU_MILLI)
    if node.cpu_milli:
        score += (node.cpu_free - pod.cpu_milli) / node.cpu_milli
    if node.memory_mib:
        score += (node.memory_free - pod.memory_mib) / node.memory_mib
    return score


class BestFit(Policy):
    """The fitting node left with the least resources (equal weights over GPU, CPU and
    memory, like the paper's BestFit baseline); on it, the tightest GPU."""

    name = "best-fit"

    def choose(self, pod: Pod) -> Placement | None:
        """The tightest fitting node."""
        best = -1
        best_score = 0.0
        for index, node in enumerate(self.cluster.nodes):
            if not pod.fits(node):
                continue
            score = remaining_score(node, pod)
            if best < 0 or score < best_score:
                best, best_score = index, score
        if best < 0:
            return None
        return Placement(best, pod.gpu_choice(self.cluster.nodes[best]))


# A node as placement sees it: model, sorted free GPU shares, free CPU, free memory.
Signature = tuple[str, tuple[int, ...], int, int]


def _signature(node: Node) -> Signature:
    return (node.gpu_model, tuple(sorted(node.gpu_free)), node.cpu_free, node.memory_free)


class FragmentationGradient(Policy):
    """FGD-style: the node and GPUs whose placement raises cluster fragmentation the least.

    Only the chosen node's fragmentation changes, so each node's current value is cached
    and a candidate costs one memoised lookup of its state after placement. Nodes in the
    same state (signature) are evaluated once per pod.
    """

    name = "fgd"

    def __init__(self, shapes: Sequence[Shape]) -> None:
        super().__init__()
        self.fragmentation = Fragmentation(shapes)
        self._frag: list[float] = []
        self._sig: list[Signature] = []

    def bind(self, cluster: Cluster) -> None:
        """Start placing on `cluster`, caching each node's state and fragmentation."""
        super().bind(cluster)
        self._sig = [_signature(node) for node in cluster.nodes]
        self._frag = [self.fragmentation.of_node(node) for node in cluster.nodes]

    def placed(self, pod: Pod, placement: Placement) -> None:
        """Refresh the chosen node's cached state: the only one that changed."""
        node = self.cluster.nodes[placement.node]
        self._sig[placement.node] = _signature(node)
        self._frag[placement.node] = self.fragmentation.of_node(node)

    def choose(self, pod: Pod) -> Placement | None:
        """The candidate with the smallest fragmentation increase."""
        nodes = self.cluster.nodes
        of_state = self.fragmentation.of_state
        seen: set[Signature] = set()
        best_index = -1
        best_free = -1  # free share of the GPU to take, for a shared pod
        best_delta = 0.0
        per_gpu = pod.per_gpu_milli
        for index, sig in enumerate(self._sig):
            if sig in seen:
                continue
            seen.add(sig)
            node = nodes[index]
            if not pod.fits(node):
                continue
            model, free, cpu_free, _ = sig
            cpu_after = cpu_free - pod.cpu_milli
            before = self._frag[index]
            if pod.shared:
                # One candidate per distinct free share that can take the pod.
                last = -1
                for position, share in enumerate(free):
                    if share < per_gpu or share == last:
                        continue
                    last = share
                    after = sorted((*free[:position], share - per_gpu, *free[position + 1 :]))
                    delta = of_state(model, tuple(after), cpu_after) - before
                    if best_index < 0 or delta < best_delta:
                        best_index, best_free, best_delta = index, share, delta
                continue
            if pod.num_gpu == 0:
                after_free = free
            else:
                # Whole GPUs: which free ones are taken does not change the state.
                after_free = tuple(sorted((*free[: -pod.num_gpu], *(0,) * pod.num_gpu)))
            delta = of_state(model, after_free, cpu_after) - before
            if best_index < 0 or delta < best_delta:
                best_index, best_free, best_delta = index, -1, delta
        if best_index < 0:
            return None
        node = nodes[best_index]
        if best_free >= 0:
            return Placement(best_index, (node.gpu_free.index(best_free),))
        return Placement(best_index, pod.gpu_choice(node))


POLICY_NAMES = ("first-fit", "random", "best-fit", "fgd")
BEST_POLICY = "fgd"


def make_policy(name: str, seed: int, shapes: Sequence[Shape]) -> Policy:
    """A policy by name; `seed` drives `random`, `shapes` (the target workload) `fgd`."""
    factories: dict[str, Callable[[], Policy]] = {
        "first-fit": FirstFit,
        "random": lambda: RandomFit(seed),
        "best-fit": BestFit,
        "fgd": lambda: FragmentationGradient(shapes),
    }
    factory = factories.get(name)
    if factory is None:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}")
    return factory()
