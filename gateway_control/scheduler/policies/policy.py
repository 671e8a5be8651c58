"""The placement policy interface. Imports no policy: the policies build on it.

A policy is bound to a cluster, asked to `choose` for one pod at a time, and told what
was `placed` so it can keep per-node caches current. Ties go to the lowest node index.
"""

from __future__ import annotations

from gateway_control.scheduler.cluster import Cluster, Placement, Pod


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

    def released(self, pod: Pod, placement: Placement) -> None:
        """Called after the cluster took `placement` of `pod` back; by default the same
        cache refresh as `placed` (policies that hold more, such as a node reserved for
        a large job, override it)."""
        self.placed(pod, placement)
