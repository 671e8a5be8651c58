"""Quotas per tenant (`autoscaling.quotas` in cluster.yaml): the loop grows a tenant's
models only within its GPUs, its higher priorities first; other tenants are not held."""

from __future__ import annotations

from gateway_control.cluster_config import ClusterConfig
from gateway_control.placement.autoscaler import Autoscaler
from gateway_control.placement.deployment import plan_deployments
from gateway_control.placement.queueing_model import Demand

SURGE = Demand(arrival_rate=20.0, service_s=1.0, queued=40, in_flight=8)


def fleet(quota_gpus: float) -> ClusterConfig:
    scale = {"min_replicas": 1, "max_replicas": 4}
    return ClusterConfig.model_validate(
        {
            "nodes": [
                {"name": f"n{i}", "url": f"http://127.0.0.1:{8100 + 10 * i}", "gpus": 1}
                for i in range(8)
            ],
            "deployments": [
                {"model": "chat", "tenant": "acme", "priority": 10, "autoscale": scale},
                {"model": "search", "tenant": "acme", "priority": 0, "autoscale": scale},
                {"model": "batch", "tenant": "globex", "autoscale": scale},
                {"model": "fixed", "tenant": "acme", "replicas": 1},
            ],
            "autoscaling": {"quotas": {"acme": {"max_gpus": quota_gpus}}},
        }
    )


def test_a_tenant_grows_within_its_quota_higher_priority_first() -> None:
    cluster = fleet(quota_gpus=4)  # fixed holds 1, chat and search 1 each: room for 1
    autoscaler = Autoscaler(cluster, None, {"chat": 4, "search": 4, "batch": 4})
    plan = plan_deployments(autoscaler.cluster_for(cluster))
    surge = {"chat": SURGE, "search": SURGE, "batch": SURGE}
    changes = {c.model: c for c in autoscaler.decide(plan, 0.0, surge)}
    # It asked for 4; the quota leaves room for one more.
    assert (changes["chat"].desired, changes["chat"].reason) == (2, "quota")
    assert "search" not in changes  # held at 1: the quota is spent
    # globex has no quota: its model grows as far as its demand asks.
    assert changes["batch"].desired == 4
    assert autoscaler.desired == {"chat": 2, "search": 1, "batch": 4}


def test_no_whole_replica_left_in_the_quota_holds_the_tenants_models() -> None:
    cluster = fleet(quota_gpus=3.5)  # room for half a GPU: no whole replica
    autoscaler = Autoscaler(cluster, None, {"chat": 4, "search": 4, "batch": 4})
    plan = plan_deployments(autoscaler.cluster_for(cluster))
    decisions = autoscaler.decide(plan, 0.0, {"chat": SURGE, "search": SURGE, "batch": SURGE})
    assert {c.model for c in decisions} == {"batch"}
    assert autoscaler.desired["chat"] == 1 and autoscaler.desired["search"] == 1
