"""The placement policies' node-state cache (`policies/tracked.py`), under every policy."""

from __future__ import annotations

import pytest

from gateway_control.scheduler.cluster import Cluster, Node, Pod
from gateway_control.scheduler.fragmentation import target_workload
from gateway_control.scheduler.policies.registry import POLICY_NAMES, make_policy


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_a_down_node_does_not_hide_its_healthy_twin(name: str) -> None:
    down, twin = Node("a", 2, "A100", 8000, 8192), Node("b", 2, "A100", 8000, 8192)
    down.healthy = False
    pod = Pod("p", 1, 1000, 1000, 1024)
    policy = make_policy(name, seed=1, shapes=target_workload([pod]))
    policy.bind(Cluster([down, twin]))
    placement = policy.choose(pod)
    assert placement is not None
    assert placement.node == 1
