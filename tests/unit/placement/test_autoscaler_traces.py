"""The closed loop's interval as a trace of its own (tracing on): a span per model's
decision with its inputs and its outcome, exported over OTLP to a real receiver."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.observability import tracing
from gateway.observability.trace_settings import TracingSettings
from gateway_control.placement.autoscaler import Autoscaler
from gateway_control.placement.deployment import plan_deployments
from gateway_control.placement.queueing_model import Demand
from gateway_tools.dev.otlp_receiver import OtlpReceiver, SpanFile
from gateway_tools.dev.processes import free_port
from tests import ports
from tests.unit.placement.test_autoscaler_flaps import BURST, cluster


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    port = free_port(start=ports.COLLECTORS + 700, end=ports.COLLECTORS + 768)
    received = OtlpReceiver(SpanFile(None), port).start()
    tracing.start(TracingSettings(f"http://127.0.0.1:{port}/v1/traces", schedule_delay_s=0.05))
    try:
        yield received
    finally:
        tracing.stop()
        received.stop()


def test_each_interval_is_a_trace_with_a_span_per_decision(receiver: OtlpReceiver) -> None:
    config = cluster(max_replicas=2)
    loop = Autoscaler(config, None, {"llm": 4})
    plan = plan_deployments(loop.cluster_for(config))
    loop.observe(plan, 0.0)
    changes = loop.decide(plan, 0.0, {"llm": BURST})
    assert [(c.current, c.desired) for c in changes] == [(1, 2)]
    loop.decide(plan, 10.0, {"llm": Demand(arrival_rate=0.0, service_s=1.0)})
    tracing.stop()  # exports what is queued

    spans = receiver.spans.recent()
    roots = [s for s in spans if s.name == "gateway.autoscale"]
    assert [root.attributes["gateway.autoscale.changes"] for root in roots] == [1, 0]
    assert len({root.trace_id for root in roots}) == 2  # each interval its own trace
    (up,) = [s for s in spans if s.parent_span_id == roots[0].span_id]
    assert up.name == "gateway.autoscale llm"
    assert up.attributes["gateway.autoscale.direction"] == "up"
    assert up.attributes["gateway.autoscale.reason"] == "demand"
    assert (
        up.attributes["gateway.autoscale.current"],
        up.attributes["gateway.autoscale.desired"],
    ) == (1, 2)
    assert up.attributes["gateway.autoscale.arrival_rate"] == 100.0
    (held,) = [s for s in spans if s.parent_span_id == roots[1].span_id]
    assert held.attributes["gateway.autoscale.direction"] == "none"
