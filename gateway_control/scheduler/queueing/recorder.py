"""The replay's timeline: allocated, fragmented and down GPU and the queue length, recorded
after every instant. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gateway_control.scheduler.cluster import Node
from gateway_control.scheduler.fragmentation import Fragmentation, Shape
from gateway_control.scheduler.queueing.measures import Timeline


class Recorder:
    """Keeps each node's fragmentation (recomputed only for nodes that changed) and the
    timeline of the signals in `measures.SERIES`."""

    def __init__(self, nodes: Sequence[Node], shapes: Sequence[Shape]) -> None:
        self._nodes = nodes
        self._measure = Fragmentation(shapes)
        self._node_frag = [self._measure.of_node(node) for node in nodes]
        self.timeline = Timeline()

    def record(
        self,
        now: float,
        changed: Iterable[int],
        capacity_milli: int,
        allocated_milli: int,
        down_milli: int,
        pending: int,
    ) -> None:
        """Record the state at `now`; `changed`: the nodes changed since the last record."""
        for index in changed:
            self._node_frag[index] = self._measure.of_node(self._nodes[index])
        capacity = capacity_milli or 1
        self.timeline.record(
            now,
            (
                100.0 * allocated_milli / capacity,
                100.0 * sum(self._node_frag) / capacity,
                100.0 * down_milli / capacity,
                float(pending),
            ),
        )
