"""A policy base that tracks each node's state (signature), so that nodes in the same state
are evaluated once per pod. Pure."""

from __future__ import annotations

from collections.abc import Iterator

from gateway_control.scheduler.cluster import Cluster, Node, Placement, Pod
from gateway_control.scheduler.policies.policy import Policy

# A node as placement sees it: model, sorted free GPU shares, free CPU, free memory, and
# the CPU and memory capacity (which best-fit's score divides by).
Signature = tuple[str, tuple[int, ...], int, int, int, int]


def node_signature(node: Node) -> Signature:
    """The state of `node` as far as placement cares."""
    return (
        node.gpu_model,
        tuple(sorted(node.gpu_free)),
        node.cpu_free,
        node.memory_free,
        node.cpu_milli,
        node.memory_mib,
    )


class TrackedPolicy(Policy):
    """A policy that keeps each node's signature, so that nodes in the same state (most
    of them: a cluster has few node types) are evaluated once per pod."""

    def __init__(self) -> None:
        super().__init__()
        self.signatures: list[Signature] = []

    def bind(self, cluster: Cluster) -> None:
        """Start placing on `cluster`, caching each node's signature."""
        super().bind(cluster)
        self.signatures = [node_signature(node) for node in cluster.nodes]

    def placed(self, pod: Pod, placement: Placement) -> None:
        """Refresh the chosen node's signature: the only one that changed."""
        self.signatures[placement.node] = node_signature(self.cluster.nodes[placement.node])

    def distinct(self, pod: Pod) -> Iterator[tuple[int, Signature]]:
        """The first node of each signature that fits `pod`, in node order."""
        nodes = self.cluster.nodes
        seen: set[Signature] = set()
        for index, sig in enumerate(self.signatures):
            # Health is not part of the signature: a node that is down must not stand
            # for the healthy ones in its state.
            if sig in seen or not nodes[index].healthy:
                continue
            seen.add(sig)
            if pod.fits(nodes[index]):
                yield index, sig
