"""cluster.yaml: placing model replicas on nodes, and placing them again after a failure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway_control.cluster_config import ClusterConfig, load_cluster
from gateway_control.placement.deployment import plan_deployments


def cluster(nodes: dict[str, int], *deployments: dict[str, Any]) -> ClusterConfig:
    return ClusterConfig.model_validate(
        {
            "nodes": [
                {"name": name, "url": f"http://127.0.0.1:{8100 + 10 * i}", "gpus": gpus}
                for i, (name, gpus) in enumerate(nodes.items())
            ],
            "deployments": list(deployments),
        }
    )


def where(plan: Any) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for p in plan.placements:
        found.setdefault(p.model, []).append(p.node)
    return found


def test_higher_priority_is_placed_when_capacity_runs_short() -> None:
    plan = plan_deployments(
        cluster(
            {"a": 1},
            {"model": "chat", "priority": 0},
            {"model": "search", "priority": 5},
        )
    )
    assert where(plan) == {"search": ["a"]}
    assert plan.unplaced == {"chat": 1}


def test_replicas_of_a_model_spread_over_nodes() -> None:
    plan = plan_deployments(cluster({"a": 4, "b": 4, "c": 4}, {"model": "chat", "replicas": 3}))
    assert sorted(where(plan)["chat"]) == ["a", "b", "c"]


def test_replicas_share_a_node_when_no_other_fits() -> None:
    plan = plan_deployments(cluster({"a": 2, "b": 0 + 1}, {"model": "chat", "replicas": 3}))
    assert sorted(where(plan)["chat"]) == ["a", "a", "b"]
    assert plan.unplaced == {}


def test_shared_replicas_take_halves_of_one_gpu() -> None:
    plan = plan_deployments(
        cluster({"a": 1}, {"model": "small", "replicas": 2, "gpus": 1, "gpu_milli": 500})
    )
    assert [(p.node, p.gpus) for p in plan.placements] == [("a", (0,)), ("a", (0,))]


def test_after_a_node_fails_only_its_replicas_move() -> None:
    config = cluster(
        {"a": 2, "b": 2, "c": 2},
        {"model": "large", "replicas": 2, "priority": 1},
        {"model": "small", "replicas": 2},
    )
    before = plan_deployments(config)
    lost = {p for p in before.placements if p.node == "a"}
    assert lost
    after = plan_deployments(config, down={"a"}, keep=before)
    # Every replica that was not on `a` is still where it was ...
    assert {p for p in before.placements if p.node != "a"} <= set(after.placements)
    # ... and the lost ones run again elsewhere.
    assert all(p.node != "a" for p in after.placements)
    assert len(after.placements) == 4
    assert after.unplaced == {}


def test_lost_replicas_wait_when_no_capacity_is_left() -> None:
    config = cluster({"a": 1, "b": 1}, {"model": "large", "replicas": 2})
    before = plan_deployments(config)
    after = plan_deployments(config, down={"b"}, keep=before)
    assert where(after) == {"large": ["a"]}
    assert after.unplaced == {"large": 1}


def test_the_shipped_cluster_file_places_every_replica() -> None:
    config = load_cluster(str(Path(__file__).parents[3] / "config/cluster.yaml"))
    plan = plan_deployments(config)
    assert plan.unplaced == {}
    assert len(plan.placements) == sum(d.replicas for d in config.deployments)


@pytest.mark.parametrize("down", ["node-a", "node-b"])
def test_with_a_node_down_every_model_of_the_shipped_cluster_keeps_a_replica(down: str) -> None:
    """Availability before redundancy: the demo's two nodes, one of them dead."""
    config = load_cluster(str(Path(__file__).parents[3] / "config/cluster.yaml"))
    after = plan_deployments(config, down={down}, keep=plan_deployments(config))
    assert set(where(after)) == {d.model for d in config.deployments}
    assert all(p.node != down for p in after.placements)


def test_every_model_gets_a_replica_before_any_gets_a_second() -> None:
    plan = plan_deployments(
        cluster(
            {"a": 2},
            {"model": "large", "replicas": 2, "priority": 10},
            {"model": "small", "replicas": 2},
        )
    )
    assert where(plan) == {"large": ["a"], "small": ["a"]}
    assert plan.unplaced == {"large": 1, "small": 1}


def test_when_not_every_model_fits_the_higher_priority_ones_keep_a_replica() -> None:
    plan = plan_deployments(
        cluster(
            {"a": 1},
            {"model": "low", "replicas": 1, "priority": 0},
            {"model": "high", "replicas": 2, "priority": 5},
        )
    )
    assert where(plan) == {"high": ["a"]}
    assert plan.unplaced == {"low": 1, "high": 1}


def scaled(model: str, replicas: int, priority: int, min_replicas: int = 1) -> dict[str, Any]:
    autoscale = {"min_replicas": min_replicas, "max_replicas": 4}
    return {"model": model, "replicas": replicas, "priority": priority, "autoscale": autoscale}


def test_a_higher_priority_reclaims_a_lower_priority_replica_above_its_minimum() -> None:
    fleet = {"a": 1, "b": 1, "c": 1, "d": 1}
    before = plan_deployments(cluster(fleet, scaled("chat", 2, 10), scaled("batch", 2, 0)))
    grown = cluster(fleet, scaled("chat", 3, 10), scaled("batch", 2, 0))
    after = plan_deployments(grown, keep=before)
    assert len(after.nodes_of("chat")) == 3
    assert len(after.nodes_of("batch")) == 1
    assert after.unplaced == {"batch": 1}  # still wanted: placed again when room returns
    # The batch replica that stayed is where it was: only the reclaimed one moved.
    assert set(after.nodes_of("batch")) <= set(before.nodes_of("batch"))


def test_nothing_is_reclaimed_below_a_minimum_from_a_young_replica_or_for_a_lower_priority() -> (
    None
):
    fleet = {"a": 1, "b": 1}
    before = plan_deployments(cluster(fleet, scaled("chat", 1, 10), scaled("batch", 1, 0)))
    # At its minimum (1): batch keeps it.
    at_minimum = plan_deployments(
        cluster(fleet, scaled("chat", 2, 10), scaled("batch", 1, 0)), keep=before
    )
    assert where(at_minimum) == where(before) and at_minimum.unplaced == {"chat": 1}
    # Above its minimum (0) but protected (younger than its minimum runtime).
    young = plan_deployments(
        cluster(fleet, scaled("chat", 2, 10), scaled("batch", 1, 0, min_replicas=0)),
        keep=before,
        protected={("batch", 0)},
    )
    assert where(young) == where(before) and young.unplaced == {"chat": 1}
    # A lower priority never takes from a higher one.
    lower = plan_deployments(
        cluster(fleet, scaled("chat", 1, 10, min_replicas=0), scaled("batch", 2, 0)),
        keep=before,
    )
    assert where(lower) == where(before) and lower.unplaced == {"batch": 1}


def test_a_deployment_without_autoscale_is_never_reclaimed() -> None:
    fleet = {"a": 1}
    fixed = {"model": "batch", "replicas": 1, "priority": 0}
    before = plan_deployments(cluster(fleet, fixed))
    after = plan_deployments(cluster(fleet, fixed, scaled("chat", 1, 10)), keep=before)
    assert where(after) == {"batch": ["a"]} and after.unplaced == {"chat": 1}
