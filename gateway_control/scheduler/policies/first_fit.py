"""`first-fit`: the first node, in list order, that fits. Pure."""

from __future__ import annotations

from gateway_control.scheduler.cluster import Placement, Pod
from gateway_control.scheduler.policies.policy import Policy


class FirstFit(Policy):
    """The first node, in list order, that fits."""

    name = "first-fit"

    def choose(self, pod: Pod) -> Placement | None:
        """The first fitting node, its GPUs chosen by `Pod.gpu_choice`."""
        for index, node in enumerate(self.cluster.nodes):
            if pod.fits(node):
                return Placement(index, pod.gpu_choice(node))
        return None
