"""`best-fit`: the fitting node left with the least resources (the paper's BestFit). Pure."""

from __future__ import annotations

from gateway_control.scheduler.cluster import Placement, Pod
from gateway_control.scheduler.policies.scores import remaining_score
from gateway_control.scheduler.policies.tracked import TrackedPolicy


class BestFit(TrackedPolicy):
    """The fitting node left with the least resources (equal weights over GPU and CPU,
    like the paper's BestFit baseline); on it, the tightest GPU."""

    name = "best-fit"

    def choose(self, pod: Pod) -> Placement | None:
        """The tightest fitting node."""
        nodes = self.cluster.nodes
        best = -1
        best_score = 0.0
        for index, _ in self.distinct(pod):
            score = remaining_score(nodes[index], pod)
            if best < 0 or score < best_score:
                best, best_score = index, score
        if best < 0:
            return None
        return Placement(best, pod.gpu_choice(nodes[best]))
