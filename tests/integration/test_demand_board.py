"""Gateways' demand shared through real Redis (a server, a Cluster, fakeredis): what the
placement leader sums per model, reports that expire by Redis's clock, and reports it
cannot read, which count as missing rather than as zero demand."""

from __future__ import annotations

import asyncio
import itertools

import orjson
import pytest
from redis.asyncio import Redis, RedisCluster

from gateway.admission import AdmissionController
from gateway.config import ModelConfig
from gateway.serving.runtime import _route
from gateway_control.cluster_config import ClusterConfig
from gateway_control.placement.autoscaler import Autoscaler
from gateway_control.placement.controller import ClusterPlacement, placement_digest
from gateway_control.placement.demand_board import (
    ClassReport,
    DemandBoard,
    DemandTracker,
    GatewayReport,
    ModelReport,
)
from gateway_control.placement.demand_reporter import DemandReporter
from tests.polling import wait_until

_prefixes = itertools.count()


def board(client: Redis | RedisCluster, stale_after_s: float = 30.0) -> DemandBoard:
    return DemandBoard(client, f"demand-test-{next(_prefixes)}", stale_after_s)


def report(gateway: str, at: float, **models: ModelReport) -> GatewayReport:
    return GatewayReport(gateway, at, models)


async def test_the_leader_sums_every_gateways_demand_per_model(
    client: Redis | RedisCluster,
) -> None:
    shared = board(client)
    tracker = DemandTracker()
    # Gateway clocks far apart: only each one's own differences count.
    await shared.publish(report("gw-a", 100.0, llm=ModelReport(10, 8, 8.0, 0, 2)))
    await shared.publish(report("gw-b", 9_000.0, llm=ModelReport(0, 0, 0.0, 1, 0)))
    first = tracker.update(await shared.read())
    # First sight: no rate yet, but what waits and runs counts at once.
    assert (first["llm"].arrival_rate, first["llm"].queued, first["llm"].in_flight) == (0, 1, 2)

    await shared.publish(report("gw-a", 110.0, llm=ModelReport(60, 48, 48.0, 3, 4)))
    await shared.publish(
        report("gw-b", 9_005.0, llm=ModelReport(25, 20, 40.0, 2, 1, ttft_p95_s=0.9))
    )
    demand = tracker.update(await shared.read())["llm"]
    assert demand.arrival_rate == pytest.approx(50 / 10 + 25 / 5)
    # 40 s held by gw-a's 40 completions and 40 s by gw-b's 20: 80 s for 60.
    assert demand.service_s == pytest.approx(80 / 60)
    assert (demand.queued, demand.in_flight, demand.ttft_p95_s) == (5, 5, 0.9)


async def test_a_report_expires_by_redis_and_its_gateway_is_forgotten(
    client: Redis | RedisCluster,
) -> None:
    shared = board(client, stale_after_s=0.3)
    await shared.publish(report("gw-a", 1.0, llm=ModelReport(1, 1, 1.0, 0, 0)))
    assert [r.gateway for r in await shared.read()] == ["gw-a"]

    async def expired() -> bool:
        return await shared.read() == []

    await wait_until(expired, timeout_s=10)
    assert await client.smembers(shared.gateways_key) == set()
    # A gateway that went away takes its demand with it: the model is missing.
    assert DemandTracker().update(await shared.read()) == {}


@pytest.mark.parametrize(
    "value",
    [
        b"not json",
        b'{"at": 1}',
        b'{"at": -1, "models": {}}',
        b'{"at": 1, "models": {"llm": [1, 2]}}',
        b'{"at": 1, "models": {"llm": [-1, 0, 0, 0, 0, null]}}',
        b'{"at": 1, "models": {"llm": [1, 0, 1e999, 0, 0, null]}}',
        b'{"at": 1, "models": {"llm": [true, 0, 0, 0, 0, null]}}',
        b'{"at": 1, "models": ["llm"]}',
    ],
)
async def test_a_report_it_cannot_read_is_no_report(
    client: Redis | RedisCluster, value: bytes
) -> None:
    shared = board(client)
    await shared.publish(report("gw-good", 1.0, llm=ModelReport(1, 1, 1.0, 0, 0)))
    await client.set(f"{shared.gateways_key.rsplit(':', 1)[0]}:demand:gw-bad", value)
    await client.sadd(shared.gateways_key, "gw-bad")
    assert [r.gateway for r in await shared.read()] == ["gw-good"]


async def test_a_reports_classes_travel_beside_what_an_earlier_leader_reads(
    client: Redis | RedisCluster,
) -> None:
    shared = board(client)
    classes = {"online": ClassReport(3, 300, 1, 100, 2), "batch": ClassReport(16, 320, 0, 0, 0)}
    sent = ModelReport(19, 10, 9.0, 1, 2, 0.4, 1_000, classes)
    await shared.publish(report("gw-a", 1.0, llm=sent))
    (got,) = await shared.read()
    assert got.models["llm"] == sent
    # The classes are a key of their own: `models` is what an earlier leader reads.
    body = orjson.loads(await client.get(f"{shared.gateways_key.rsplit(':', 1)[0]}:demand:gw-a"))
    assert body["models"]["llm"] == [19, 10, 9.0, 1, 2, 0.4]
    bad = dict(body, work={"llm": [1, {"online": [1, 2, 3]}]})
    await client.set(f"{shared.gateways_key.rsplit(':', 1)[0]}:demand:gw-a", orjson.dumps(bad))
    assert await shared.read() == []  # a report it cannot read is no report


async def test_two_gateways_admissions_reach_the_leader_as_one_demand(
    client: Redis | RedisCluster,
) -> None:
    """Two gateways' own admission controllers, each reporting on a clock of its own:
    the tracker sees their arrivals summed and what waits on either."""
    shared = board(client)
    clocks = {"a": [0.0], "b": [500.0]}
    controllers = {}
    reporters = {}
    for name in clocks:
        admission = AdmissionController(("online",))
        admission.configure_model("llm", 10, lambda: 1)
        controllers[name] = admission
        reporters[name] = DemandReporter(
            shared, admission, ["llm"], 10.0, gateway=f"gw-{name}",
            clock=lambda name=name: clocks[name][0],
        )  # fmt: skip
    tracker = DemandTracker()
    for reporter in reporters.values():
        assert await reporter.publish_once()
    tracker.update(await shared.read())

    held = []
    for name, count in (("a", 3), ("b", 1)):
        for _ in range(count):
            slot = await controllers[name].acquire("llm", "t", priority="online", cost_tokens=1)
            controllers[name].release(slot, 1)
        held.append(await controllers[name].acquire("llm", "t", priority="online", cost_tokens=1))
    waiting = asyncio.create_task(
        controllers["a"].acquire("llm", "t", priority="online", cost_tokens=1)
    )
    await asyncio.sleep(0)
    for name in clocks:
        clocks[name][0] += 2.0
        assert await reporters[name].publish_once()
    demand = tracker.update(await shared.read())["llm"]
    # a: 5 arrivals in 2 s, b: 2 in 2 s.
    assert demand.arrival_rate == pytest.approx(3.5)
    assert (demand.queued, demand.in_flight) == (1, 2)
    waiting.cancel()


async def test_a_move_waits_for_every_other_gateway_to_follow_and_drain(
    client: Redis | RedisCluster,
) -> None:
    """The leader unloads a leaving replica only once each other gateway's fresh report
    serves from the new placement and has no request left on a replica it took out
    (here the placement serves llm nowhere: any replica of it is leaving)."""
    cluster = ClusterConfig.model_validate(
        {
            "nodes": [{"name": "n1", "url": "http://127.0.0.1:1", "gpus": 1}],
            "deployments": [
                {"model": "llm", "replicas": 1, "autoscale": {"min_replicas": 0, "max_replicas": 1}}
            ],
        }
    )
    shared = board(client)
    route = _route("llm", ModelConfig.model_validate({"backend": "triton_http", "replicas": []}))
    placement = ClusterPlacement(
        cluster, {"llm": route}, 1.0, 3, autoscaler=Autoscaler(cluster, shared, {"llm": 1})
    )
    placement.gateway_id = "leader"
    digest = placement_digest(placement.plan)
    busy = ModelReport(0, 0, 0.0, 0, 0)

    async def others(plan: str, on_leaving: int) -> bool:
        draining = {"llm": {"http://127.0.0.1:1": on_leaving}} if on_leaving else {}
        await shared.publish(GatewayReport("gw-b", 1.0, {"llm": busy}, plan, draining))
        return await placement.others_drained(digest)

    assert await placement.others_drained(digest)  # nobody else reports
    assert not await others("an-older-placement", 0)  # has not followed yet
    assert not await others(digest, 2)  # followed; two streams still on the replica
    assert await others(digest, 0)
    # The leader's own report (stale by an interval) is not waited for.
    await shared.publish(GatewayReport("leader", 1.0, {"llm": busy}, "old", {}))
    assert await placement.others_drained(digest)
