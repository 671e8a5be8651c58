"""The gateway serves a model where cluster.yaml's deployment is placed, and places it
again on another node when its node fails; each placement is a trace of its own."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
import yaml
from openai import OpenAI, OpenAIError

from gateway_tools.dev.otlp_receiver import OtlpReceiver, Span, SpanFile
from gateway_tools.dev.processes import free_port
from gateway_tools.dev.sim.server import TritonSim
from tests import ports
from tests.e2e.conftest import two_sims
from tests.e2e.stack import KEYS, Gateway, model, start_gateway


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    port = free_port(start=ports.COLLECTORS + 710, end=ports.COLLECTORS + 760)
    received = OtlpReceiver(SpanFile(None), port).start()
    yield received
    received.stop()


@pytest.fixture(scope="module")
def nodes() -> Iterator[tuple[TritonSim, TritonSim]]:
    """Two Triton servers of this module's own (the test kills one); both start with
    llm-small loaded."""
    with two_sims("llm-small=1", "llm-small=1") as pair:
        yield pair


@pytest.fixture(scope="module")
def placed(
    nodes: tuple[TritonSim, TritonSim],
    receiver: OtlpReceiver,
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Gateway]:
    a, b = nodes
    tmp = tmp_path_factory.mktemp("cluster")
    (tmp / "cluster.yaml").write_text(
        yaml.safe_dump(
            {
                "nodes": [
                    {"name": "node-a", "url": a.http_url, "gpus": 1},
                    {"name": "node-b", "url": b.http_url, "gpus": 1},
                ],
                "deployments": [{"model": "llm-small", "replicas": 1, "gpus": 1}],
            }
        )
    )
    placed_model = model("triton_http", [])
    del placed_model["replicas"]  # the cluster says where it runs
    gateway = start_gateway(
        tmp,
        {"llm-small": placed_model},
        redis_url,
        gateway={
            "cluster_file": "cluster.yaml",
            "node_probe_interval_s": 0.3,
            "node_down_after": 2,
            "tracing": {
                "endpoint": f"http://127.0.0.1:{receiver.http_port}/v1/traces",
                "schedule_delay_s": 0.1,
            },
        },
    )
    yield gateway
    gateway.process.terminate()
    gateway.process.wait(15)


def ready(sim: TritonSim, name: str) -> bool:
    try:
        with urllib.request.urlopen(f"{sim.http_url}/v2/models/{name}/ready", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def chat(gateway: Gateway) -> str:
    client = OpenAI(base_url=gateway.base_url, api_key=KEYS["acme"], max_retries=0, timeout=10)
    answer = client.chat.completions.create(
        model="llm-small", messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    return answer.model


def test_the_model_moves_to_the_surviving_node(
    placed: Gateway, nodes: tuple[TritonSim, TritonSim], receiver: OtlpReceiver
) -> None:
    a, b = nodes
    # One replica, one GPU a node: it runs on one node, and the other unloads it.
    assert ready(a, "llm-small") != ready(b, "llm-small")
    host, other = (a, b) if ready(a, "llm-small") else (b, a)
    assert chat(placed) == "llm-small"

    host.kill()
    deadline = time.monotonic() + 60
    while True:
        try:
            assert chat(placed) == "llm-small"
            break
        except OpenAIError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)
    assert ready(other, "llm-small")
    assert "is down: its replicas are placed elsewhere" in placed.log
    # The move is a trace of the leader's: its plan around the node that is down, and
    # the load on the other node.
    host_name, other_name = ("node-a", "node-b") if host is a else ("node-b", "node-a")

    def moved(spans: list[Span]) -> list[Span]:
        plans = [s for s in spans if s.name == "gateway.placement.plan"]
        return [p for p in plans if host_name in p.attributes["gateway.placement.nodes_down"]]

    deadline = time.monotonic() + 30
    while not moved(receiver.spans.recent()):
        assert time.monotonic() < deadline, [s.name for s in receiver.spans.recent()]
        time.sleep(0.2)
    spans = receiver.spans.recent()
    plan = moved(spans)[-1]  # a failed apply is placed again: the last one moved it
    assert plan.attributes["gateway.placement.replicas"] == [f"llm-small#0@{other_name}"]
    trace = [s for s in spans if s.trace_id == plan.trace_id]
    (root,) = [s for s in trace if s.name == "gateway.placement"]
    assert root.parent_span_id == "" and plan.parent_span_id == root.span_id
    (load,) = [s for s in trace if s.name == "gateway.placement.load"]
    assert f"{other_name}: load llm-small" in load.attributes["gateway.placement.actions"]
