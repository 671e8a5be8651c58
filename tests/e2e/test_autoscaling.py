"""The closed loop on real Triton servers: a burst on a model raises its desired
replicas and a second node loads it, with no request failing, and a third the fleet has
no room for is wanted and reported unplaced; when demand falls to a
trickle the replica drains and is unloaded, again with no request failing; an idle
model scales to zero, and its next request waits for its first replica."""

from __future__ import annotations

import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from openai import APIStatusError, OpenAI, OpenAIError

from gateway_tools.dev.sim.server import TritonSim
from tests.e2e.conftest import start_sim, two_sims
from tests.e2e.stack import KEYS, Gateway, model, start_gateway

# A hang guard for each wait, far above what the loop needs.
GUARD_S = 90.0


@pytest.fixture(scope="module")
def nodes() -> Iterator[tuple[TritonSim, TritonSim]]:
    with two_sims("llm-small=40", "llm-small=40") as pair:  # 40 ms a token
        yield pair


@pytest.fixture(scope="module")
def scaled(
    nodes: tuple[TritonSim, TritonSim], redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    a, b = nodes
    tmp = tmp_path_factory.mktemp("autoscale")
    cluster = {
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
                    # One more than the two 1-GPU nodes hold: demand the fleet cannot meet.
                    "max_replicas": 3,
                    # Loose: a trickle needs one replica, a burst of 7 clients more.
                    "targets": {"queue_wait_p95_s": 2.0},
                    "scale_down_after_s": 3,
                    "min_runtime_s": 0,
                },
            }
        ],
        "autoscaling": {"interval_s": 0.5, "stale_after_s": 5},
    }
    yield from placed_gateway(tmp, cluster, redis_url, queue={"max_in_flight_per_replica": 2})


def placed_gateway(
    tmp: Path, cluster: dict[str, Any], redis_url: str, **model_settings: Any
) -> Iterator[Gateway]:
    """A gateway serving llm-small where `cluster` (written into `tmp`) places it, with
    a Redis key prefix of its own: gateways that share one share one fleet (its demand
    board and placement), and these are separate fleets."""
    (tmp / "cluster.yaml").write_text(yaml.safe_dump(cluster))
    placed_model = model("triton_http", [], **model_settings)
    del placed_model["replicas"]  # the cluster says where it runs
    gateway = start_gateway(
        tmp,
        {"llm-small": placed_model},
        redis_url,
        gateway={
            "redis": {"url": redis_url, "key_prefix": f"autoscaling-{tmp.name}"},
            "cluster_file": "cluster.yaml",
            "node_probe_interval_s": 0.3,
        },
    )
    yield gateway
    gateway.process.terminate()
    gateway.process.wait(15)


def ready(sim: TritonSim) -> bool:
    try:
        with urllib.request.urlopen(f"{sim.http_url}/v2/models/llm-small/ready", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def exposition(gateway: Gateway) -> str:
    with urllib.request.urlopen(f"{gateway.ops_url}/metrics", timeout=5) as response:
        return response.read().decode()


def replicas(gateway: Gateway, state: str) -> float | None:
    text = exposition(gateway)
    found = re.search(rf'gateway_model_replicas\{{model="llm-small",state="{state}"\}} (\S+)', text)
    return None if found is None else float(found.group(1))


def wait_for(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + GUARD_S
    while not check():
        assert time.monotonic() < deadline, f"still not so after {GUARD_S} s: {what}"
        time.sleep(0.2)


def test_a_burst_adds_a_replica_without_losing_a_request_and_quiet_removes_it(
    scaled: Gateway, nodes: tuple[TritonSim, TritonSim]
) -> None:
    a, b = nodes
    wait_for(lambda: replicas(scaled, "ready") == 1, "one replica placed")
    assert [ready(a), ready(b)].count(True) == 1

    stop = threading.Event()
    answered: list[str] = []
    failed: list[str] = []

    def client(until: threading.Event) -> None:
        openai = OpenAI(base_url=scaled.base_url, api_key=KEYS["acme"], max_retries=0, timeout=30)
        while not until.is_set():
            try:
                reply = openai.chat.completions.create(
                    model="llm-small", messages=[{"role": "user", "content": "hi"}], max_tokens=16
                )
                answered.append(reply.model)
            except OpenAIError as exc:
                failed.append(repr(exc))

    trickle_stop = threading.Event()
    trickle = threading.Thread(target=client, args=(trickle_stop,))
    burst = [threading.Thread(target=client, args=(stop,)) for _ in range(7)]
    for thread in [trickle, *burst]:
        thread.start()
    try:
        wait_for(lambda: ready(a) and ready(b), "llm-small loaded on both nodes")
        wait_for(lambda: replicas(scaled, "ready") == 2, "two replicas placed")
        # More than the fleet holds: the third is wanted, unplaced, and says so.
        wait_for(lambda: replicas(scaled, "desired") == 3, "a third replica wanted")
        assert replicas(scaled, "ready") == 2
        assert 'gateway_replicas_unplaced{model="llm-small"} 1.0' in exposition(scaled)
        time.sleep(1.0)  # both nodes serve it now
        stop.set()
        for thread in burst:
            thread.join(30)
        assert failed == [] and len(answered) > 8
        assert re.search(r"autoscale llm-small: 1 -> [23] \(demand", scaled.log)

        # A trickle: after scale_down_after_s, one replica again; the other node's
        # requests drain first, and the node unloads it; the trickle never fails.
        wait_for(lambda: replicas(scaled, "desired") == 1, "desired back to one")
        wait_for(lambda: [ready(a), ready(b)].count(True) == 1, "one node unloads it")
        served_before = len(answered)
        time.sleep(1.0)
    finally:
        stop.set()
        trickle_stop.set()
        for thread in [trickle, *burst]:
            thread.join(30)
    assert failed == [] and len(answered) > served_before
    assert "autoscale llm-small: 2 -> 1 (quiet" in scaled.log
    assert 'gateway_replicas_unplaced{model="llm-small"} 0.0' in exposition(scaled)


@pytest.fixture(scope="module")
def idle_node() -> Iterator[TritonSim]:
    sim = start_sim("llm-small=40")
    try:
        yield sim
    finally:
        sim.stop()


@pytest.fixture(scope="module")
def to_zero(
    idle_node: TritonSim, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("to-zero")
    cluster = {
        "nodes": [{"name": "node-a", "url": idle_node.http_url, "gpus": 1}],
        "deployments": [
            {
                "model": "llm-small",
                "replicas": 1,
                "autoscale": {
                    "min_replicas": 0,
                    "max_replicas": 1,
                    "scale_down_after_s": 2,
                    "min_runtime_s": 0,
                },
            }
        ],
        "autoscaling": {"interval_s": 0.5, "stale_after_s": 5},
    }
    yield from placed_gateway(tmp, cluster, redis_url)


def test_an_idle_model_scales_to_zero_and_its_next_request_waits_for_its_first_replica(
    to_zero: Gateway, idle_node: TritonSim
) -> None:
    wait_for(lambda: replicas(to_zero, "desired") == 0, "scaled to zero")
    wait_for(lambda: not ready(idle_node), "the node unloads it")
    client = OpenAI(base_url=to_zero.base_url, api_key=KEYS["acme"], max_retries=0, timeout=60)
    hi: Any = [{"role": "user", "content": "hi"}]
    # A deadline shorter than a load: 503 model_starting with Retry-After, and the
    # request woke the model all the same.
    with pytest.raises(APIStatusError) as starting:
        client.chat.completions.create(
            model="llm-small", messages=hi, max_tokens=4,
            extra_headers={"x-request-timeout": "0.3"},
        )  # fmt: skip
    assert starting.value.status_code == 503
    assert starting.value.code == "model_starting"
    assert int(starting.value.response.headers["retry-after"]) >= 1
    wait_for(lambda: ready(idle_node), "its first replica loaded")
    assert "autoscale llm-small: 0 -> 1 (wake_from_zero" in to_zero.log

    # At zero again, a request with time to wait is answered once the replica is up.
    wait_for(lambda: replicas(to_zero, "desired") == 0, "scaled to zero again")
    wait_for(lambda: not ready(idle_node), "unloaded again")
    reply = client.chat.completions.create(model="llm-small", messages=hi, max_tokens=4)
    assert reply.model == "llm-small"
