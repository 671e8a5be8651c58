"""The closed loop when things go wrong, on real Triton servers: a replica that never
becomes ready (its load fails, tried again each interval, the model served meanwhile by
the replica it has), and the leader killed in the middle of a move, with a config
reload in that move too: another gateway's streams on the leaving replica are waited
for by the old leader and then by the new one, and finish; nothing is lost."""

from __future__ import annotations

import itertools
import re
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from openai import OpenAI, OpenAIError

from gateway.config import ModelConfig
from gateway.inference.types import ChatMessage, InferenceRequest, RequestKind, SamplingParams
from gateway.serving.runtime import _route
from gateway_tools.dev.sim.model_template import natural_length
from gateway_tools.dev.sim.server import TritonSim
from tests.e2e.conftest import two_sims
from tests.e2e.stack import KEYS, Gateway, default_tenants, model, start_gateway, tenant
from tests.e2e.test_autoscaling import exposition, ready, replicas, wait_for

HI: Any = [{"role": "user", "content": "hi"}]
# acme and globex, and ops: an admin (its key, sk-test-ops, may call /admin/reload).
TENANTS = default_tenants(["llm-small"]) | {"ops": tenant("ops", ["*"], admin=True)}


def scaled_cluster(a: TritonSim, b: TritonSim, **autoscale: Any) -> dict[str, Any]:
    return {
        "nodes": [
            {"name": "node-a", "url": a.http_url, "gpus": 1},
            {"name": "node-b", "url": b.http_url, "gpus": 1},
        ],
        "deployments": [
            {
                "model": "llm-small",
                "replicas": 1,
                "autoscale": {
                    "min_replicas": 1,
                    "max_replicas": 2,
                    "targets": {"queue_wait_p95_s": 2.0},
                    "scale_down_after_s": 2,
                    "min_runtime_s": 0,
                    **autoscale,
                },
            }
        ],
        "autoscaling": {"interval_s": 0.5, "stale_after_s": 5, "drain_timeout_s": 60},
    }


def gateway_on(
    tmp: Path,
    cluster: dict[str, Any],
    redis_url: str,
    prefix: str,
    slots: int = 2,
    **settings: Any,
) -> Gateway:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "cluster.yaml").write_text(yaml.safe_dump(cluster))
    placed = model("triton_http", [], queue={"max_in_flight_per_replica": slots})
    del placed["replicas"]
    return start_gateway(
        tmp,
        {"llm-small": placed},
        redis_url,
        tenants=TENANTS,
        gateway={
            "redis": {"url": redis_url, "key_prefix": prefix},
            "cluster_file": "cluster.yaml",
            "node_probe_interval_s": 0.3,
            **settings,
        },
    )


def keep_asking(
    gateway: Gateway,
    max_tokens: int,
    stop: threading.Event,
    answered: list[str],
    failed: list[str],
) -> None:
    """Chat requests one after another until `stop`: each answer's model, or error."""
    openai = OpenAI(base_url=gateway.base_url, api_key=KEYS["acme"], max_retries=0, timeout=30)
    while not stop.is_set():
        try:
            reply = openai.chat.completions.create(
                model="llm-small", messages=HI, max_tokens=max_tokens
            )
            answered.append(reply.model)
        except OpenAIError as exc:
            failed.append(repr(exc))


def stopped(gateway: Gateway) -> None:
    if gateway.process.poll() is None:
        gateway.process.terminate()
        gateway.process.wait(15)


@pytest.fixture
def half_broken(redis_url: str, tmp_path: Path) -> Iterator[tuple[Gateway, TritonSim, TritonSim]]:
    # node-b's repository has no llm-small: a replica placed there never loads.
    with two_sims("llm-small=40", "llm-large=40") as (a, b):
        gateway = gateway_on(tmp_path, scaled_cluster(a, b), redis_url, "faults-never-ready")
        try:
            yield gateway, a, b
        finally:
            stopped(gateway)


def test_a_replica_that_never_loads_is_tried_each_interval_and_the_model_served_meanwhile(
    half_broken: tuple[Gateway, TritonSim, TritonSim],
) -> None:
    gateway, a, b = half_broken
    wait_for(lambda: replicas(gateway, "ready") == 1, "one replica ready")
    stop = threading.Event()
    answered: list[str] = []
    failed: list[str] = []

    burst = [
        threading.Thread(target=keep_asking, args=(gateway, 16, stop, answered, failed))
        for _ in range(6)
    ]
    for thread in burst:
        thread.start()
    try:
        wait_for(lambda: replicas(gateway, "desired") == 2, "a second replica wanted")
        wait_for(lambda: gateway.log.count("applying the placement failed") >= 2, "retried")
        assert replicas(gateway, "ready") == 1  # desired above ready: the alert's signal
        assert "load llm-small: HTTP 500" in gateway.log  # Triton: not in its repository
    finally:
        stop.set()
        for thread in burst:
            thread.join(30)
    assert failed == [] and len(answered) > 6
    assert ready(a) and not ready(b)


def longest_seeds(count: int) -> list[int]:
    """Seeds for which the simulator's answer to HI is its longest (64 tokens): it ends
    an answer at a length drawn from the prompt and the seed."""
    config = model("triton_http", [])
    route = _route("llm-small", ModelConfig.model_validate(config))
    seeds = []
    for seed in itertools.count():
        request = InferenceRequest(
            RequestKind.CHAT, "llm-small", SamplingParams(max_tokens=400, seed=seed),
            messages=(ChatMessage("user", "hi"),),
        )  # fmt: skip
        if natural_length(route.upstream_call(request).prompt.encode(), seed) == 64:
            seeds.append(seed)
            if len(seeds) == count:
                return seeds
    raise AssertionError("unreachable")


def stream(gateway: Gateway, seed: int, outcome: dict[str, Any]) -> None:
    """One long stream; its finish reason (or its error) in `outcome`."""
    openai = OpenAI(base_url=gateway.base_url, api_key=KEYS["acme"], max_retries=0, timeout=90)
    try:
        chunks = openai.chat.completions.create(
            model="llm-small", messages=HI, max_tokens=400, seed=seed, stream=True
        )
        for chunk in chunks:
            if chunk.choices and chunk.choices[0].finish_reason:
                outcome["finish"] = chunk.choices[0].finish_reason
    except OpenAIError as exc:
        outcome["error"] = repr(exc)


def test_the_leader_killed_during_a_drain_is_replaced_and_no_stream_is_lost(
    redis_url: str, tmp_path: Path
) -> None:
    elected = {"placement": {"leader_election": "redis", "lease_ttl_s": 3}}
    # 250 ms a token: a 64-token answer streams for 16 s.
    with two_sims("llm-small=250", "llm-small=250") as (a, b):
        # Two replicas from the start, and eight seconds of quiet before one goes: time
        # for the second gateway to start and its streams to begin.
        cluster = scaled_cluster(a, b, scale_down_after_s=8)
        cluster["deployments"][0]["replicas"] = 2
        first = gateway_on(tmp_path / "first", cluster, redis_url, "faults-leader", **elected)
        second = None
        try:
            wait_for(lambda: "placement leader:" in first.log, "the first gateway leads")
            second = gateway_on(tmp_path / "second", cluster, redis_url, "faults-leader", **elected)
            wait_for(lambda: ready(a) and ready(b), "both replicas loaded")
            assert "autoscale llm-small: 2 -> 1" not in first.log
            # Two streams of 16 s through the follower: least load puts one on each
            # node, so one is on whichever replica the quiet removes.
            outcomes: list[dict[str, Any]] = [{}, {}]
            streams = [
                threading.Thread(target=stream, args=(second, seed, outcome))
                for seed, outcome in zip(longest_seeds(2), outcomes, strict=True)
            ]
            for thread in streams:
                thread.start()
            wait_for(lambda: "autoscale llm-small: 2 -> 1 (quiet" in first.log, "scale-down")
            time.sleep(2.0)  # past the two probe intervals: only the stream holds the drain
            assert ready(a) and ready(b)  # the follower's stream is waited for

            # A config change in the middle of the move: the leader takes a new tenant.
            tenants = TENANTS | {"initech": tenant("initech", ["*"])}
            (first.config_dir / "tenants.yaml").write_text(yaml.safe_dump({"tenants": tenants}))
            reload = urllib.request.Request(
                f"{first.ops_url}/admin/reload",
                method="POST",
                headers={"Authorization": "Bearer sk-test-ops"},
            )
            with urllib.request.urlopen(reload, timeout=10) as response:
                assert response.status == 200
            assert ready(a) and ready(b)

            first.process.send_signal(signal.SIGKILL)  # the leader, mid-drain
            first.process.wait(10)
            wait_for(lambda: "placement leader:" in second.log, "the second gateway takes over")
            for thread in streams:
                thread.join(60)
            assert [o.get("finish") for o in outcomes] == ["stop", "stop"], outcomes
            # The new leader went on from the published placement (one replica), drained
            # what the old one left loaded, then unloaded it.
            wait_for(lambda: [ready(a), ready(b)].count(True) == 1, "the new leader unloads it")
            assert "autoscale llm-small: 2 -> 1" not in second.log
            assert replicas(second, "ready") == 1
            assert 'gateway_replicas_unplaced{model="llm-small"} 0.0' in exposition(second)
        finally:
            if second is not None:
                stopped(second)
            stopped(first)


def test_a_node_lost_during_a_drain_ends_the_drain_and_nothing_else_fails(
    redis_url: str, tmp_path: Path
) -> None:
    with two_sims("llm-small=250", "llm-small=250") as (a, b):
        cluster = scaled_cluster(a, b, scale_down_after_s=3)
        cluster["deployments"][0]["replicas"] = 2
        # Six requests at once per replica: the four streams and the trickle fit on one,
        # so quiet removes a replica while the streams still run.
        gateway = gateway_on(tmp_path, cluster, redis_url, "faults-node-lost", slots=6)
        try:
            wait_for(lambda: ready(a) and ready(b), "both replicas loaded")
            # Four 16 s streams (least load spreads them over both nodes), and a trickle
            # of short requests beside them.
            outcomes: list[dict[str, Any]] = [{}, {}, {}, {}]
            streams = [
                threading.Thread(target=stream, args=(gateway, seed, outcome))
                for seed, outcome in zip(longest_seeds(4), outcomes, strict=True)
            ]
            for thread in streams:
                thread.start()
            stop = threading.Event()
            answered: list[str] = []
            failed: list[str] = []

            client = threading.Thread(target=keep_asking, args=(gateway, 2, stop, answered, failed))
            client.start()
            wait_for(lambda: "autoscale llm-small: 2 -> 1 (quiet" in gateway.log, "scale-down")
            alone = re.compile(r"placement: llm-small#0@(node-[ab]); unplaced")
            wait_for(lambda: alone.search(gateway.log) is not None, "the new placement")
            found = alone.search(gateway.log)
            assert found is not None
            leaving, lost = (b, "node-b") if found.group(1) == "node-a" else (a, "node-a")
            time.sleep(1.0)
            assert ready(a) and ready(b)  # draining: streams are on the leaving node
            served_before_the_loss = len(answered)
            leaving.kill()  # the node that drains dies: its stream dies with it
            wait_for(lambda: f"node {lost} is down" in gateway.log, "the node is down")
            time.sleep(2.0)
            stop.set()
            client.join(30)
            for thread in streams:
                thread.join(60)
            # The streams on the node that stayed finished; those on the dead node did not.
            finished = [o.get("finish") for o in outcomes]
            assert finished.count("stop") >= 1 and finished.count(None) >= 1, outcomes
            assert set(finished) <= {"stop", None}, outcomes
            # Every short request was served: after the scale-down none went to the node
            # that died, and the node's loss did not make the move fail anything else.
            assert failed == [] and len(answered) > served_before_the_loss
            # The drain stopped waiting for a dead node's requests: no drain timeout.
            assert "drain: requests still on replicas that leave" not in gateway.log
            assert replicas(gateway, "ready") == 1 and replicas(gateway, "desired") == 1
        finally:
            stopped(gateway)
