"""`random`: a node and GPU chosen uniformly among those that fit (the paper's Random). Pure."""

from __future__ import annotations

import random

from gateway_control.scheduler.cluster import Placement, Pod
from gateway_control.scheduler.policies.policy import Policy


class RandomFit(Policy):
    """A node chosen uniformly among those that fit, and for a shared pod a GPU chosen
    uniformly among those with room, from a seeded generator (the paper's Random)."""

    name = "random"

    def __init__(self, seed: int) -> None:
        super().__init__()
        self._rng = random.Random(seed)

    def choose(self, pod: Pod) -> Placement | None:
        """A random fitting node and GPU."""
        fitting = [i for i, node in enumerate(self.cluster.nodes) if pod.fits(node)]
        if not fitting:
            return None
        index = self._rng.choice(fitting)
        node = self.cluster.nodes[index]
        if pod.shared:
            room = [i for i, free in enumerate(node.gpu_free) if free >= pod.per_gpu_milli]
            return Placement(index, (self._rng.choice(room),))
        # Whole GPUs: any free ones leave the node in the same state.
        return Placement(index, pod.gpu_choice(node))
