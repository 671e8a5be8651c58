"""The closed loop acting on Kubernetes: a model's Triton Deployment scaled through its
`scale` subresource, against the stand-in API server (tests/fake_kube_api.py: no
kube-apiserver runs here), from demand shared through real Redis; and the Autoscaler's
own rule on placed replicas: none is removed before its minimum runtime."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from gateway.observability import metrics
from gateway_control.cluster_config import Autoscale, ClusterConfig
from gateway_control.placement.autoscaler import Autoscaler
from gateway_control.placement.demand_board import DemandBoard, GatewayReport, ModelReport
from gateway_control.placement.deployment import DeploymentPlan, ReplicaPlacement
from gateway_control.placement.kubernetes_scale import DeploymentScaler
from gateway_tools.dev.processes import free_port
from tests import ports
from tests.fake_kube_api import FakeApi, kubeconfig, serving

_prefixes = itertools.count()


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[tuple[FakeApi, str]]:
    port = free_port(start=ports.DNS_SERVERS, end=ports.DNS_SERVERS + 500)
    async with serving(port) as fake:
        yield fake, str(kubeconfig(tmp_path / "kubeconfig", port))


def cluster(config: str) -> ClusterConfig:
    return ClusterConfig.model_validate({
        "nodes": [{"name": "node-a", "url": "http://127.0.0.1:9", "gpus": 1}],
        "deployments": [
            {"model": "llm", "replicas": 1, "autoscale": {"max_replicas": 4}},
            {"model": "other", "replicas": 1},
        ],
        "autoscaling": {"interval_s": 1, "kubernetes": {
            "deployments": {"llm": "triton-llm"}, "namespace": "gw", "kubeconfig": config,
        }},
    })  # fmt: skip


def placed(model: str) -> float | None:
    labels = {"model": model, "state": "ready"}
    return metrics.REGISTRY.get_sample_value("gateway_model_replicas", labels)


async def test_demand_scales_the_models_deployment_and_not_the_nodes(
    api: tuple[FakeApi, str], redis_url: str
) -> None:
    fake, config = api
    fake.deployments["gw", "triton-llm"] = 1
    settings = cluster(config)
    assert settings.autoscaling.kubernetes is not None
    redis = Redis.from_url(redis_url)
    board = DemandBoard(redis, f"k8s-scale-{next(_prefixes)}", 30)
    scaler = DeploymentScaler(settings.autoscaling.kubernetes)
    autoscaler = Autoscaler(settings, board, {"llm": 4}, scaler)
    try:
        # The nodes are not asked to run the model Kubernetes runs.
        assert [d.model for d in autoscaler.cluster_for(settings).deployments] == ["other"]
        await board.publish(GatewayReport("gw-1", 0.0, {"llm": ModelReport(0, 0, 0.0, 0, 0)}))
        await autoscaler.step(DeploymentPlan(), 0.0)
        busy = ModelReport(200, 190, 190.0, 30, 8)  # 20 requests/s of 1 s each
        await board.publish(GatewayReport("gw-1", 10.0, {"llm": busy}))
        changes = await autoscaler.step(DeploymentPlan(), 10.0)
        assert [(c.model, c.direction) for c in changes] == [("llm", "up")]
        assert await autoscaler.act(changes) is False  # nothing for the nodes to do
        assert fake.scale_patches == [("triton-llm", 4)]  # max_replicas
        assert fake.deployments["gw", "triton-llm"] == 4
        assert placed("llm") == 4.0

        # The API refuses (here: the Deployment is gone): the change is not taken as
        # made, so the next interval decides it again.
        del fake.deployments["gw", "triton-llm"]
        assert await autoscaler.act(changes) is False
        assert autoscaler.desired["llm"] == 1
    finally:
        await scaler.close()
        await redis.aclose()


async def test_a_replica_younger_than_min_runtime_is_not_removed(redis_url: str) -> None:
    """Demand stayed low past scale_down_after_s, but the replica a scale-down would
    remove has run less than min_runtime_s: the change waits (reason min_runtime)."""
    settings = ClusterConfig.model_validate({
        "nodes": [{"name": "node-a", "url": "http://127.0.0.1:9", "gpus": 2}],
        "deployments": [{"model": "llm", "replicas": 2, "autoscale": {
            "max_replicas": 2, "scale_down_after_s": 10, "min_runtime_s": 1000,
        }}],
        "autoscaling": {"interval_s": 1},
    })  # fmt: skip
    redis = Redis.from_url(redis_url)
    board = DemandBoard(redis, f"k8s-scale-{next(_prefixes)}", 30)
    autoscaler = Autoscaler(settings, board, {"llm": 4})
    plan = DeploymentPlan([ReplicaPlacement("llm", i, "node-a", (i,)) for i in range(2)])
    try:
        autoscaler.observe(plan, 0.0)  # both replicas placed at t=0
        decisions = []
        for now in range(0, 60, 5):
            idle = GatewayReport("gw-1", float(now), {"llm": ModelReport(0, 0, 0.0, 0, 0)})
            await board.publish(idle)
            decisions += await autoscaler.step(plan, float(now))
        assert decisions == [] and autoscaler.desired["llm"] == 2
    finally:
        await redis.aclose()


async def test_on_kubernetes_a_pod_younger_than_min_runtime_is_not_scaled_away(
    api: tuple[FakeApi, str], redis_url: str
) -> None:
    """A pod's age is counted from the loop's ask for it (its start is not read): the
    Deployment is not scaled down before the newest pod could have run min_runtime_s."""
    fake, config = api
    fake.deployments["gw", "triton-llm"] = 1
    base = cluster(config)
    quick = {"max_replicas": 4, "scale_down_after_s": 5, "min_runtime_s": 100}
    llm = base.deployments[0].model_copy(update={"autoscale": Autoscale(**quick)})
    settings = base.model_copy(update={"deployments": [llm, *base.deployments[1:]]})
    assert settings.autoscaling.kubernetes is not None
    redis = Redis.from_url(redis_url)
    board = DemandBoard(redis, f"k8s-scale-{next(_prefixes)}", 300)
    scaler = DeploymentScaler(settings.autoscaling.kubernetes)
    autoscaler = Autoscaler(settings, board, {"llm": 4}, scaler)
    idle = ModelReport(200, 200, 200.0, 0, 0)
    try:
        await board.publish(GatewayReport("gw-1", 0.0, {"llm": ModelReport(0, 0, 0.0, 0, 0)}))
        await autoscaler.step(DeploymentPlan(), 0.0)
        await board.publish(
            GatewayReport("gw-1", 10.0, {"llm": ModelReport(200, 190, 190.0, 30, 8)})
        )
        await autoscaler.act(await autoscaler.step(DeploymentPlan(), 10.0))
        assert fake.deployments["gw", "triton-llm"] == 4
        held = []
        for now in range(20, 110, 10):  # quiet, past scale_down_after_s: the pods are young
            await board.publish(GatewayReport("gw-1", float(now), {"llm": idle}))
            held += await autoscaler.step(DeploymentPlan(), float(now))
        assert held == [] and fake.deployments["gw", "triton-llm"] == 4
        await board.publish(GatewayReport("gw-1", 120.0, {"llm": idle}))
        changes = await autoscaler.step(DeploymentPlan(), 120.0)
        assert [(c.direction, c.reason) for c in changes] == [("down", "quiet")]
    finally:
        await scaler.close()
        await redis.aclose()
