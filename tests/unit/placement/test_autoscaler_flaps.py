"""The flap rule as the leader applies it (issue 40): a scale-down that unloaded a replica
and a rise soon after double the wait of the next scale-down; a scale-down held by a
minimum runtime, or one that took only a replica that was never placed, does not; on
Kubernetes (nothing placed on the nodes) every scale-down counts."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, cast

import pytest

from gateway_control.cluster_config import ClusterConfig
from gateway_control.placement.autoscaler import Autoscaler
from gateway_control.placement.deployment import DeploymentPlan, plan_deployments
from gateway_control.placement.queueing_model import Demand
from gateway_control.placement.replica_planner import ScaleDecision

BURST = Demand(arrival_rate=100.0, service_s=1.0, queued=128, in_flight=8)
QUIET = Demand(arrival_rate=0.2, service_s=1.0)


def cluster(min_runtime_s: float = 0.0, max_replicas: int = 2, gpus: int = 2) -> ClusterConfig:
    return ClusterConfig.model_validate({
        "autoscaling": {"interval_s": 10},
        "nodes": [{"name": "a", "url": "http://127.0.0.1:8000", "gpus": gpus}],
        "deployments": [{
            "model": "llm", "replicas": 1,
            "autoscale": {
                "min_replicas": 1, "max_replicas": max_replicas, "slots_per_replica": 4,
                "scale_down_after_s": 60, "min_runtime_s": min_runtime_s,
            },
        }],
    })  # fmt: skip


class FakeScaler:
    """Stands in for a `DeploymentScaler`: `llm` is a Deployment's pods."""

    def manages(self, model: str) -> bool:
        return model == "llm"


def run(
    loop: Autoscaler, config: ClusterConfig, seen: Callable[[float], Demand], until: float
) -> tuple[float, list[ScaleDecision]]:
    """Decide every 10 s on `seen(now)`, placing what is decided; (the last time, the
    changes)."""
    plan: DeploymentPlan = plan_deployments(loop.cluster_for(config))
    changes: list[ScaleDecision] = []
    now = 0.0
    while now < until:
        loop.observe(plan, now)
        decided = loop.decide(plan, now, {"llm": seen(now)})
        changes += decided
        if decided:
            plan = plan_deployments(loop.cluster_for(config), keep=plan)
        now += 10
    return now, changes


def bursts(now: float) -> Demand:
    return BURST if now % 150 == 0 else QUIET


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)


def test_a_replica_unloaded_and_loaded_again_doubles_the_wait() -> None:
    config = cluster()
    _, changes = run(Autoscaler(config, None, {"llm": 4}), config, bursts, 160)
    assert [c.direction for c in changes] == ["up", "down", "up"]
    assert changes[-1].down_wait_s == 120


def test_a_scale_down_held_by_the_minimum_runtime_is_no_flap() -> None:
    config = cluster(min_runtime_s=1000, max_replicas=3, gpus=3)

    def seen(now: float) -> Demand:  # two replicas' worth, quiet, then a burst
        return Demand(5.0, 1.0, in_flight=4) if now == 0 else BURST if now == 150 else QUIET

    _, changes = run(Autoscaler(config, None, {"llm": 4}), config, seen, 160)
    # Its replicas were too young to go all through the quiet: the burst is no flap.
    assert [(c.current, c.desired) for c in changes] == [(1, 2), (2, 3)]
    assert changes[-1].down_wait_s == 60


def test_a_scale_down_of_a_replica_that_never_fitted_is_no_flap() -> None:
    config = cluster(gpus=1)  # room for one replica: the second waits, unplaced
    loop = Autoscaler(config, None, {"llm": 4})
    _, changes = run(loop, config, bursts, 160)
    assert [c.direction for c in changes] == ["up", "down", "up"]
    assert changes[-1].down_wait_s == 60


def test_on_kubernetes_every_scale_down_counts() -> None:
    config = cluster()
    loop = Autoscaler(config, None, {"llm": 4}, scaler=cast(Any, FakeScaler()))
    _, changes = run(loop, config, bursts, 160)
    assert [c.direction for c in changes] == ["up", "down", "up"]
    assert changes[-1].down_wait_s == 120
