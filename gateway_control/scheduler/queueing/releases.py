"""Where resources were given back, so that a blocked job is retried only when it could help.

A job that no node can take stays unplaceable until something is released on a node that
could host it when empty: jobs starting elsewhere only take resources. The replay asks
`released_since` before calling the policy again for a shape that failed, which keeps an
overloaded replay from re-running the same failing searches at every event. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway_control.scheduler.cluster import Node, Pod

PodShape = tuple[int, int, int, int, frozenset[str]]  # what placement sees of a pod


def pod_shape(pod: Pod) -> PodShape:
    """GPU count, per-GPU share, CPU, memory and allowed models: all that fit depends on."""
    return (pod.num_gpu, pod.per_gpu_milli, pod.cpu_milli, pod.memory_mib, pod.gpu_models)


class ReleaseLog:
    """The nodes on which resources were released, in order, and which nodes could host a
    pod shape at all (when empty and healthy)."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        self._released: list[int] = []
        self._size = len(nodes)
        # Node types, each with an empty prototype and the indices of its nodes.
        types: dict[tuple[str, int, int, int], tuple[Node, list[int]]] = {}
        for index, node in enumerate(nodes):
            key = (node.gpu_model, node.gpus, node.cpu_milli, node.memory_mib)
            if key not in types:
                types[key] = (
                    Node(node.name, node.gpus, node.gpu_model, node.cpu_milli, node.memory_mib),
                    [],
                )
            types[key][1].append(index)
        self._types = list(types.values())
        self._masks: dict[PodShape, bytearray] = {}

    @property
    def mark(self) -> int:
        """A position in the log: what `released_since` compares against."""
        return len(self._released)

    def released(self, node: int) -> None:
        """Record that resources were given back on `node` (a job left, a node was repaired)."""
        self._released.append(node)

    def hostable(self, pod: Pod) -> bytearray:
        """Per node index, 1 when the node could host `pod` empty."""
        shape = pod_shape(pod)
        mask = self._masks.get(shape)
        if mask is None:
            mask = bytearray(self._size)
            for prototype, indices in self._types:
                if pod.fits(prototype):
                    for index in indices:
                        mask[index] = 1
            self._masks[shape] = mask
        return mask

    def ever_fits(self, pod: Pod) -> bool:
        """Whether some node could host `pod` when empty."""
        return any(self.hostable(pod))

    def released_since(self, mark: int, pod: Pod) -> bool:
        """Whether anything was released, since `mark`, on a node that could host `pod`."""
        mask = self.hostable(pod)
        released = self._released
        return any(mask[released[i]] for i in range(mark, len(released)))

    def fits_released(self, mark: int, pod: Pod, nodes: Sequence[Node]) -> bool:
        """Whether `pod` now fits one of the nodes released on since `mark`. When it fitted
        no node at `mark`, this is whether it fits any node now: the others only lost
        resources since."""
        mask = self.hostable(pod)
        return any(pod.fits(nodes[index]) for index in set(self._released[mark:]) if mask[index])
