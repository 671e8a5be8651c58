"""gateway_control.scheduler.policies.registry: every policy by name; unknown names."""

from __future__ import annotations

import pytest

from gateway_control.scheduler.policies.registry import POLICY_NAMES, make_policy
from tests.unit.scheduler.packing_helpers import choose, node, pod


def test_no_fit_anywhere() -> None:
    for name in POLICY_NAMES:
        assert choose(name, [node(gpus=2)], pod(num_gpu=4)) is None, name


def test_unknown_policy() -> None:
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("worst-fit", 0, ())
