"""`fgd`: fragmentation gradient descent (Weng et al., ATC'23): the placement that raises
the cluster's fragmentation for the target workload the least. Pure."""

from __future__ import annotations

from collections.abc import Sequence

from gateway_control.scheduler.cluster import Cluster, Placement, Pod
from gateway_control.scheduler.fragmentation import Fragmentation, Shape
from gateway_control.scheduler.policies.scores import remaining_score
from gateway_control.scheduler.policies.tracked import Signature, TrackedPolicy


class FragmentationGradient(TrackedPolicy):
    """FGD-style: the node and GPUs whose placement raises cluster fragmentation the least.

    Only the chosen node's fragmentation changes, so each node's current value is cached
    and a candidate costs one memoised lookup of its state after placement. Nodes in the
    same state (signature) are evaluated once per pod.
    """

    name = "fgd"

    def __init__(self, shapes: Sequence[Shape], tolerance_milli: float = 20.0) -> None:
        super().__init__()
        self.fragmentation = Fragmentation(shapes)
        # Fragmentation increases closer than this (thousandths of a GPU) count as equal.
        self.tolerance_milli = tolerance_milli
        self._frag: list[float] = []

    def bind(self, cluster: Cluster) -> None:
        """Start placing on `cluster`, caching each node's state and fragmentation."""
        super().bind(cluster)
        self._frag = [self.fragmentation.of_node(node) for node in cluster.nodes]

    def placed(self, pod: Pod, placement: Placement) -> None:
        """Refresh the chosen node's cached state: the only one that changed."""
        super().placed(pod, placement)
        self._frag[placement.node] = self.fragmentation.of_node(self.cluster.nodes[placement.node])

    def extra_cost(self, pod: Pod, index: int, sig: Signature) -> float:
        """A cost, in thousandths of a GPU, added to every candidate on node `index` for
        `pod`; none here. It may depend on the node only through its state `sig`: of nodes
        in the same state only the first is evaluated."""
        return 0.0

    def choose(self, pod: Pod) -> Placement | None:
        """The candidate with the smallest fragmentation increase; among equal ones, the
        node best-fit would pick (it keeps emptier nodes for the shapes still to come)."""
        nodes = self.cluster.nodes
        of_state = self.fragmentation.of_state
        per_gpu = pod.per_gpu_milli
        found: list[tuple[float, int, int]] = []  # (delta, node index, GPU share or -1)
        for index, sig in self.distinct(pod):
            model, free, cpu_free, memory_free, _, _ = sig
            cpu_after = cpu_free - pod.cpu_milli
            memory_after = memory_free - pod.memory_mib
            # What the node costs besides its fragmentation increase (subclasses).
            before = self._frag[index] - self.extra_cost(pod, index, sig)
            candidates: list[tuple[int, tuple[int, ...]]]
            if pod.shared:
                # One candidate per distinct free share that can take the pod.
                candidates = [
                    (share, tuple(sorted((*free[:at], share - per_gpu, *free[at + 1 :]))))
                    for at, share in enumerate(free)
                    if share >= per_gpu and (at == 0 or free[at - 1] != share)
                ]
            elif pod.num_gpu == 0:
                candidates = [(-1, free)]
            else:
                # Whole GPUs: which free ones are taken does not change the state.
                taken = (*free[: -pod.num_gpu], *(0,) * pod.num_gpu)
                candidates = [(-1, tuple(sorted(taken)))]
            for share, after in candidates:
                found.append(
                    (of_state(model, after, cpu_after, memory_after) - before, index, share)
                )
        if not found:
            return None
        # Deltas within the tolerance of the least are ties: best-fit among them, then the
        # least delta, then the lowest index.
        ceiling = min(found)[0] + self.tolerance_milli
        _, _, best_index, best_share = min(
            (remaining_score(nodes[index], pod), delta, index, share)
            for delta, index, share in found
            if delta <= ceiling
        )
        node = nodes[best_index]
        if best_share >= 0:
            return Placement(best_index, (node.gpu_free.index(best_share),))
        return Placement(best_index, pod.gpu_choice(node))
