"""gateway_control.scheduler.policies.first_fit."""

from __future__ import annotations

from gateway_control.scheduler.cluster import Placement
from tests.unit.scheduler.packing_helpers import choose, node, pod


def test_first_fit_picks_the_first() -> None:
    nodes = [node("a", cpu=500), node("b"), node("c")]
    assert choose("first-fit", nodes, pod()) == Placement(1, (0,))
