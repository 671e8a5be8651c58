"""gateway_control.scheduler.policies.best_fit."""

from __future__ import annotations

from gateway_control.scheduler.cluster import Placement
from tests.unit.scheduler.packing_helpers import choose, node, pod


def test_best_fit_picks_the_tightest() -> None:
    nodes = [node("a"), node("b"), node("c")]
    nodes[1].place(pod(milli=500), (0,))
    nodes[2].place(pod(milli=300), (1,))
    # b keeps 500 + 1000 free after a 500 share: the least left.
    assert choose("best-fit", nodes, pod(milli=500)) == Placement(1, (0,))
    # A whole GPU: c would keep 700, b 500: b.
    assert choose("best-fit", nodes, pod()) == Placement(1, (1,))
