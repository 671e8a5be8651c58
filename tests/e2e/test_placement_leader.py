"""Many gateways, one placement (issue 16): three gateways elect one placement leader
through a lease (in Redis, or a Kubernetes Lease on a stand-in API server: no
kube-apiserver runs here); the others serve from the placement it publishes. When the
leader dies another takes over within the lease's time; a leader that stalled past its
lease is fenced off before its next repository call."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import yaml
from openai import OpenAI
from redis.asyncio import Redis

from gateway_control.cluster_config import load_cluster
from gateway_control.placement.controller import PUBLISH_LUA
from gateway_control.placement.deployment import DeploymentPlan
from gateway_control.placement.leadership import LostLeadership, RedisLease
from gateway_control.placement.triton_repository import apply_plan, loaded_models
from gateway_tools.dev.processes import free_port, spawn, stop, wait_listening
from gateway_tools.dev.sim.server import TritonSim
from tests import ports
from tests.e2e.conftest import two_sims
from tests.e2e.stack import KEYS, Gateway, model, start_gateway
from tests.fake_kube_api import kubeconfig
from tests.polling import wait_until

# The Kubernetes Lease counts whole seconds.
LEASE_TTL_S = {"redis": 1.5, "kubernetes": 2.0}
# How long a takeover or a step-down is waited for: a hang guard, not a target (the
# lease decides when; the test checks who leads and who acts).
GUARD_S = 60.0
LEADER = re.compile(r"placement leader: \S+ \(token (\d+)\)")


@pytest.fixture(scope="module")
def nodes() -> Iterator[tuple[TritonSim, TritonSim]]:
    with two_sims("llm-small=1", "llm-small=1") as pair:
        yield pair


def cluster_yaml(a: TritonSim, b: TritonSim) -> str:
    return yaml.safe_dump({
        "nodes": [{"name": "node-a", "url": a.http_url, "gpus": 1},
                  {"name": "node-b", "url": b.http_url, "gpus": 1}],
        "deployments": [{"model": "llm-small", "replicas": 1, "gpus": 1}],
    })  # fmt: skip


def start_one(
    tmp: Path,
    nodes: tuple[TritonSim, TritonSim],
    redis_url: str,
    prefix: str,
    placement: dict[str, object],
) -> Gateway:
    tmp.mkdir(parents=True)
    (tmp / "cluster.yaml").write_text(cluster_yaml(*nodes))
    placed = model("triton_http", [])
    del placed["replicas"]  # the cluster (its leader) says where it runs
    settings = {
        "redis": {"url": redis_url, "key_prefix": prefix},
        "cluster_file": "cluster.yaml",
        "node_probe_interval_s": 0.3,
        "node_down_after": 2,
        "placement": placement,
    }
    return start_gateway(tmp, {"llm-small": placed}, redis_url, gateway=settings)


@pytest.fixture
def kubernetes_api(tmp_path: Path) -> Iterator[Path]:
    """A stand-in Kubernetes API server process; its kubeconfig."""
    port = free_port(start=ports.DNS_SERVERS, end=ports.DNS_SERVERS + 500)
    process = spawn([sys.executable, "-m", "tests.fake_kube_api", "--port", str(port)])
    try:
        wait_listening(process, port, "fake Kubernetes API")
        yield kubeconfig(tmp_path / "kubeconfig", port, namespace="gateway-test")
    finally:
        stop(process)


@pytest.fixture(params=["redis", "kubernetes"])
def election(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def gateways(
    nodes: tuple[TritonSim, TritonSim],
    redis_url: str,
    tmp_path: Path,
    election: str,
    request: pytest.FixtureRequest,
) -> Iterator[list[Gateway]]:
    prefix = f"leader-{time.time_ns()}"
    placement: dict[str, object] = {
        "leader_election": election,
        "lease_ttl_s": LEASE_TTL_S[election],
    }
    if election == "kubernetes":
        placement["kubeconfig"] = str(request.getfixturevalue("kubernetes_api"))
    started: list[Gateway] = []
    try:
        for i in range(3):
            started.append(start_one(tmp_path / f"gw{i}", nodes, redis_url, prefix, placement))
        yield started
    finally:
        for gateway in started:
            if gateway.process.poll() is None:
                os.kill(gateway.process.pid, signal.SIGCONT)
                stop(gateway.process)


def tokens(gateway: Gateway) -> list[int]:
    """The fencing tokens this gateway led under, in order."""
    return [int(m.group(1)) for m in LEADER.finditer(gateway.log)]


def answers(gateway: Gateway) -> bool:
    client = OpenAI(base_url=gateway.base_url, api_key=KEYS["acme"], max_retries=0, timeout=10)
    reply = client.chat.completions.create(
        model="llm-small", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    return reply.model == "llm-small"


async def test_one_leader_places_and_another_takes_over_when_it_dies(
    gateways: list[Gateway], election: str
) -> None:
    ttl = LEASE_TTL_S[election]
    leaders = [g for g in gateways if tokens(g)]
    assert len(leaders) == 1, [tokens(g) for g in gateways]
    [leader] = leaders
    first_token = tokens(leader)[0]
    # The followers serve from what the leader published.
    for gateway in gateways:
        assert answers(gateway)
    killed = time.monotonic()
    leader.process.kill()
    leader.process.wait()
    survivors = [g for g in gateways if g is not leader]

    async def taken_over() -> bool:
        return any(tokens(g) for g in survivors)

    await wait_until(taken_over, timeout_s=GUARD_S)
    took = time.monotonic() - killed
    new_leaders = [g for g in survivors if tokens(g)]
    assert len(new_leaders) == 1
    assert tokens(new_leaders[0]) == [first_token + 1]
    for gateway in survivors:
        assert answers(gateway)
    print(f"{election}: placement leader replaced {took:.2f} s after the leader was killed "
          f"(lease {ttl} s, renewed every {ttl / 3:.2f} s)")  # fmt: skip


async def test_a_leader_that_stalled_past_its_lease_steps_down_and_acts_no_more(
    gateways: list[Gateway], election: str
) -> None:
    [leader] = [g for g in gateways if tokens(g)]
    os.kill(leader.process.pid, signal.SIGSTOP)  # a pause longer than the lease
    others = [g for g in gateways if g is not leader]

    async def taken_over() -> bool:
        return any(tokens(g) for g in others)

    await wait_until(taken_over, timeout_s=GUARD_S)
    acted_before = leader.log.count("placement: node-")
    os.kill(leader.process.pid, signal.SIGCONT)

    async def stepped_down() -> bool:
        return "lost the lease: following" in leader.log or "no longer ours" in leader.log

    await wait_until(stepped_down, timeout_s=GUARD_S)
    assert leader.log.count("placement: node-") == acted_before
    assert sum(1 for g in others if tokens(g)) == 1


async def test_every_repository_call_is_fenced(
    nodes: tuple[TritonSim, TritonSim], redis_url: str, tmp_path: Path
) -> None:
    """A stale leader's plan to unload a model stops before the call: the model stays."""
    a, b = nodes
    (tmp_path / "cluster.yaml").write_text(cluster_yaml(a, b))
    cluster = load_cluster(str(tmp_path / "cluster.yaml"))
    redis = Redis.from_url(redis_url)
    prefix = f"fence-{time.time_ns()}"
    stale = RedisLease(redis, prefix, ttl_s=0.2, holder="stale")
    fresh = RedisLease(redis, prefix, ttl_s=10, holder="fresh")
    try:
        assert await stale.campaign() == 1
        assert await fresh.campaign() == 0  # held: no second leader
        await asyncio.sleep(0.4)  # the stale leader's lease runs out: it did not renew
        assert await fresh.campaign() == 2
        async with aiohttp.ClientSession() as session:
            before = {n.name: await loaded_models(session, n.base_url) for n in cluster.nodes}
            on = next(name for name, models in before.items() if "llm-small" in models)
            with pytest.raises(LostLeadership, match="token 1"):
                # An empty plan would unload llm-small where it runs.
                await apply_plan(cluster, DeploymentPlan(), nodes=[on], fence=stale.fence)
            after = {n.name: await loaded_models(session, n.base_url) for n in cluster.nodes}
        assert after == before
        await fresh.fence()  # the holder's own check passes
        # A placement published under token 2 is not overwritten by token 1's late write.
        publish = redis.register_script(PUBLISH_LUA)
        assert await publish(keys=[fresh.keys.plan], args=[2, '{"token": 2}']) == 1
        assert await publish(keys=[fresh.keys.plan], args=[1, '{"token": 1}']) == 0
        assert await redis.get(fresh.keys.plan) == b'{"token": 2}'
    finally:
        await fresh.release()
        await redis.aclose()
