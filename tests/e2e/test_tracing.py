"""One request, one trace: the gateway's spans and a real Triton's, joined by a client's
`traceparent`, received by an OTLP receiver over HTTP and gRPC (docs/observability.md).

The stack: a tritonserver that traces (`--trace-config mode=opentelemetry`), a gateway
whose tracing is turned on by the standard `OTEL_*` environment only, and the
project's OTLP receiver (gateway_tools/dev/otlp_receiver.py: the official protobuf
definitions, HTTP in protobuf and JSON, and gRPC)."""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from gateway_tools.dev.otlp_receiver import OtlpReceiver, Span, SpanFile
from gateway_tools.dev.processes import free_port, stop
from gateway_tools.dev.sim.repository import ModelProfile
from gateway_tools.dev.sim.server import TritonSim
from tests import ports
from tests.e2e.conftest import start_sim_profiles
from tests.e2e.stack import KEYS, Gateway, model, running_gateway, start_gateway, tenant

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
PROMPT_MARKER = "marker-of-a-private-prompt"
SERVER, CLIENT = 2, 3  # OTLP span kinds


def collector_port(span: int = 1) -> int:
    return free_port(span=span, start=ports.COLLECTORS, end=ports.COLLECTORS + 700)


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    port = collector_port(span=2)
    received = OtlpReceiver(SpanFile(None), port, grpc_port=port + 1).start()
    try:
        yield received
    finally:
        received.stop()


@pytest.fixture(scope="module")
def sim(receiver: OtlpReceiver) -> Iterator[TritonSim]:
    # llm-slow takes 2 s for its first token: past its budget (0.4 s), so a stream falls
    # back to llm-small (ttft_timeout).
    profiles = [ModelProfile("llm-slow", 0.01, 0.05), ModelProfile("llm-small", 0.005, 0.0)]
    http_port = receiver.http_port
    sim = start_sim_profiles(profiles, trace_url=f"http://127.0.0.1:{http_port}/v1/traces")
    try:
        yield sim
    finally:
        sim.stop()


def models(sim: TritonSim) -> dict[str, object]:
    return {
        "llm-slow": model(
            "triton_http",
            [sim.http_url],
            timeouts={"first_token_s": 0.4},
            fallback=["llm-small"],
        ),
        "llm-small": model("triton_grpc", [sim.grpc_target]),
    }


@pytest.fixture(scope="module")
def gateway(
    sim: TritonSim, receiver: OtlpReceiver, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    http_port = receiver.http_port
    env = {
        # Nothing in gateway.yaml: the standard environment alone turns tracing on.
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{http_port}",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    tracing = {"schedule_delay_s": 0.1}
    gw = start_gateway(
        tmp_path_factory.mktemp("tracing"),
        models(sim),
        redis_url,
        tenants={"acme": tenant("acme", ["*"])},
        gateway={"tracing": tracing},
        env=env,
    )
    try:
        yield gw
    finally:
        stop(gw.process)


def openmetrics(gateway: Gateway) -> str:
    """The ops port's exposition as a scraper asking for OpenMetrics gets it."""
    asked = urllib.request.Request(
        f"{gateway.ops_url}/metrics", headers={"Accept": "application/openmetrics-text"}
    )
    with urllib.request.urlopen(asked, timeout=5) as response:
        assert response.headers["content-type"].startswith("application/openmetrics-text")
        return str(response.read().decode())


def wait_for(receiver: OtlpReceiver, done: Callable[[list[Span]], bool]) -> list[Span]:
    """The spans received, once `done` says they are all there (30 s at most)."""
    deadline = time.monotonic() + 30
    while True:
        spans = receiver.spans.recent()
        if done(spans):
            return spans
        assert time.monotonic() < deadline, f"spans never came: {[s.name for s in spans]}"
        time.sleep(0.1)


def of_trace(spans: list[Span], trace_id: str) -> list[Span]:
    return [s for s in spans if s.trace_id == trace_id]


def named(spans: list[Span], name: str) -> list[Span]:
    return [s for s in spans if s.name == name]


def triton_requests(spans: list[Span]) -> list[Span]:
    return [s for s in spans if s.service.startswith("triton-sim") and s.name == "InferRequest"]


def test_a_streamed_fallback_is_one_trace_from_the_client_into_triton(
    gateway: Gateway, receiver: OtlpReceiver
) -> None:
    client = OpenAI(base_url=gateway.base_url, api_key=KEYS["acme"], max_retries=0)
    traceparent = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
    raw = client.chat.completions.with_raw_response.create(
        model="llm-slow",
        messages=[{"role": "user", "content": f"Say hello. {PROMPT_MARKER}"}],
        max_tokens=4,
        stream=True,
        extra_headers={"traceparent": traceparent, "tracestate": "vendor=opaque"},
    )
    assert raw.headers["x-gateway-fallback"] == "llm-slow->llm-small; reason=ttft_timeout"
    request_id = raw.headers["x-request-id"]
    text = "".join(chunk.choices[0].delta.content or "" for chunk in raw.parse() if chunk.choices)
    assert text

    def complete(spans: list[Span]) -> bool:
        mine = of_trace(spans, CLIENT_TRACE)
        return bool(named(mine, "chat llm-slow")) and len(triton_requests(mine)) == 2

    spans = of_trace(wait_for(receiver, complete), CLIENT_TRACE)
    by_id = {s.span_id: s for s in spans}
    (server,) = named(spans, "chat llm-slow")
    # The client's span is its parent: the gateway joined the client's trace.
    assert (server.kind, server.parent_span_id, server.service) == (
        SERVER,
        CLIENT_SPAN,
        "inference-gateway",
    )
    attributes = server.attributes
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.request.model"] == "llm-slow"
    assert attributes["gen_ai.response.model"] == "llm-small"
    assert attributes["gen_ai.request.max_tokens"] == 4
    assert attributes["gen_ai.response.id"] == request_id == attributes["gateway.request_id"]
    assert attributes["gen_ai.usage.input_tokens"] > 0
    assert attributes["gen_ai.usage.output_tokens"] == 4
    assert attributes["gen_ai.response.finish_reasons"] == ["length"]
    assert attributes["gateway.fallbacks"] == ["llm-slow->llm-small:ttft_timeout"]
    assert (attributes["gateway.tenant"], attributes["http.response.status_code"]) == ("acme", 200)
    assert attributes["gateway.key_id"] and KEYS["acme"] not in str(attributes)
    events = [e["name"] for e in server.events]
    assert events == ["gateway.fallback", "gateway.stream.end"]

    # Each step under the request, each model's turn with its queue and replica call.
    (limit,) = named(spans, "gateway.ratelimit")
    assert limit.parent_span_id == server.span_id and limit.attributes["gateway.ratelimit.allowed"]
    (slow,) = named(spans, "gateway.model llm-slow")
    (small,) = named(spans, "gateway.model llm-small")
    assert slow.parent_span_id == small.parent_span_id == server.span_id
    assert (slow.status, slow.attributes["gateway.model.outcome"]) == (2, "ttft_timeout")
    assert small.attributes["gateway.model.outcome"] == "served"
    assert small.start_ns >= slow.end_ns
    queues = named(spans, "gateway.queue")
    assert sorted(by_id[q.parent_span_id].name for q in queues) == [
        "gateway.model llm-slow",
        "gateway.model llm-small",
    ]
    (slow_call,) = named(spans, "gateway.upstream llm-slow")
    (small_call,) = named(spans, "gateway.upstream llm-small")
    assert slow_call.parent_span_id == slow.span_id and slow_call.kind == CLIENT
    # Cut at its first-token budget: a failure of the replica's, by kind only.
    assert (slow_call.status, slow_call.attributes["error.type"]) == (2, "TimeoutError")
    assert slow_call.attributes["gateway.protocol"] == "triton_http"
    assert small_call.parent_span_id == small.span_id
    assert small_call.attributes["gateway.protocol"] == "triton_grpc"
    assert [e["name"] for e in small_call.events] == ["gen_ai.first_token"]

    # Triton's own spans under each call: over HTTP headers and over gRPC metadata.
    parents = sorted(by_id[t.parent_span_id].name for t in triton_requests(spans))
    assert parents == ["gateway.upstream llm-slow", "gateway.upstream llm-small"]
    assert {s.name for s in spans if s.service.startswith("triton-sim")} >= {
        "InferRequest",
        "llm-small",
        "compute",
    }

    # Private by default: neither the prompt nor the key is in any span.
    assert not [s for s in receiver.spans.recent() if PROMPT_MARKER in str(s)]
    assert not [s for s in receiver.spans.recent() if KEYS["acme"] in str(s)]

    # The access line names the trace; the duration histogram's exemplar leads to it.
    log = (gateway.config_dir / "gateway.log").read_text()
    (line,) = [line for line in log.splitlines() if request_id in line and '"request"' in line]
    assert f'"trace_id":"{CLIENT_TRACE}"' in line and f'"span_id":"{server.span_id}"' in line
    assert f'trace_id="{CLIENT_TRACE}"' in openmetrics(gateway)


def test_an_unsampled_client_trace_is_not_traced_and_not_sent_on(
    gateway: Gateway, receiver: OtlpReceiver
) -> None:
    """A client that says "not sampled" is followed: no span, and no context to Triton
    (which traces any `traceparent` it gets)."""
    client = OpenAI(base_url=gateway.base_url, api_key=KEYS["acme"], max_retries=0)
    unsampled_trace = "5bf92f3577b34da6a3ce929d0e0e4736"
    client.chat.completions.create(
        model="llm-small",
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=2,
        extra_headers={"traceparent": f"00-{unsampled_trace}-{CLIENT_SPAN}-00"},
    )
    # Then a traced one: Triton exports in order, so once its spans are in, the first
    # request's would be too.
    traced = client.chat.completions.with_raw_response.create(
        model="llm-small", messages=[{"role": "user", "content": "hello"}], max_tokens=2
    )
    request_id = traced.headers["x-request-id"]

    def arrived(spans: list[Span]) -> bool:
        servers = [s for s in spans if s.attributes.get("gateway.request_id") == request_id]
        return bool(servers) and bool(triton_requests(of_trace(spans, servers[0].trace_id)))

    spans = wait_for(receiver, arrived)
    assert not of_trace(spans, unsampled_trace)
    # Triton traced only what the gateway traced.
    gateway_traces = {s.trace_id for s in spans if s.service == "inference-gateway"}
    assert {s.trace_id for s in triton_requests(spans)} <= gateway_traces


JOINED_TRACE = "6bf92f3577b34da6a3ce929d0e0e4736"
# Each case: the headers, and whether the gateway joins the client's trace.
HOSTILE_HEADERS: dict[str, tuple[dict[str, str], bool]] = {
    "10 KB traceparent": ({"traceparent": "00-" + "a" * 10_240}, False),
    "malformed": ({"traceparent": "00-zzzz-yyyy-01"}, False),
    "upper-case hex": ({"traceparent": f"00-{JOINED_TRACE.upper()}-{CLIENT_SPAN}-01"}, False),
    "all-zero trace id": ({"traceparent": f"00-{'0' * 32}-{CLIENT_SPAN}-01"}, False),
    "version ff": ({"traceparent": f"ff-{JOINED_TRACE}-{CLIENT_SPAN}-01"}, False),
    "two traceparents in one": (
        {"traceparent": f"00-{JOINED_TRACE}-{CLIENT_SPAN}-01, 00-{JOINED_TRACE}-{CLIENT_SPAN}-01"},
        False,
    ),
    # A valid traceparent is joined whatever its tracestate (left out when it is bad).
    "1,000 tracestate members": (
        {
            "traceparent": f"00-{JOINED_TRACE}-{CLIENT_SPAN}-01",
            "tracestate": ",".join(f"k{i}=v{i}" for i in range(1000)),
        },
        True,
    ),
    "10 KB tracestate": (
        {"traceparent": f"00-{JOINED_TRACE}-{CLIENT_SPAN}-01", "tracestate": "k=" + "v" * 10_240},
        True,
    ),
}


@pytest.mark.parametrize("case", HOSTILE_HEADERS.values(), ids=HOSTILE_HEADERS.keys())
def test_a_hostile_trace_context_is_ignored_never_an_error(
    gateway: Gateway, receiver: OtlpReceiver, case: tuple[dict[str, str], bool]
) -> None:
    headers, joined = case
    body = {"model": "llm-small", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    sent = {"authorization": f"Bearer {KEYS['acme']}", **headers}
    response = httpx.post(f"{gateway.base_url}/chat/completions", json=body, headers=sent)
    assert response.status_code == 200, response.text
    request_id = response.headers["x-request-id"]

    def arrived(spans: list[Span]) -> bool:
        return any(s.attributes.get("gateway.request_id") == request_id for s in spans)

    (server,) = [
        s
        for s in wait_for(receiver, arrived)
        if s.attributes.get("gateway.request_id") == request_id
    ]
    if joined:
        assert (server.trace_id, server.parent_span_id) == (JOINED_TRACE, CLIENT_SPAN)
    else:  # a trace of its own: nothing the client sent was taken
        assert server.parent_span_id == "" and server.trace_id != JOINED_TRACE


def test_spans_go_over_grpc_with_the_service_name_the_environment_gives(
    sim: TritonSim, receiver: OtlpReceiver, redis_url: str, tmp_path: Path
) -> None:
    """And with two workers (prometheus-client's multiprocess mode, as the Kubernetes
    base runs it), the exemplars still lead to the traces."""
    grpc_port = receiver.grpc_port
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{grpc_port}",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_SERVICE_NAME": "gateway-over-grpc",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "1.0",
    }
    tenants = {"acme": tenant("acme", ["*"])}
    gateway_yaml = {"tracing": {"schedule_delay_s": 0.1}}
    with running_gateway(
        tmp_path, models(sim), redis_url, tenants=tenants, gateway=gateway_yaml, env=env,
        workers=2,
    ) as gw:  # fmt: skip
        client = OpenAI(base_url=gw.base_url, api_key=KEYS["acme"], max_retries=0)
        request_ids = [
            client.completions.with_raw_response.create(
                model="llm-small", prompt="hello", max_tokens=2
            ).headers["x-request-id"]
            for _ in range(6)
        ]

        def arrived(spans: list[Span]) -> bool:
            return {s.attributes.get("gateway.request_id") for s in spans} >= set(request_ids)

        spans = wait_for(receiver, arrived)
        servers = [s for s in spans if s.attributes.get("gateway.request_id") in request_ids]
        assert {(s.service, s.name) for s in servers} == {
            ("gateway-over-grpc", "text_completion llm-small")
        }
        # The newest request's duration is its bucket's exemplar, whichever worker served
        # it (a worker writes its exemplars within a second).
        newest = max(servers, key=lambda s: s.end_ns)
        deadline = time.monotonic() + 10
        while f'trace_id="{newest.trace_id}"' not in openmetrics(gw):
            assert time.monotonic() < deadline, "the newest exemplar never showed"
            time.sleep(0.2)


def dropped(gateway: Gateway) -> dict[str, float]:
    with urllib.request.urlopen(f"{gateway.ops_url}/metrics", timeout=5) as response:
        text = response.read().decode()
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("gateway_trace_spans_dropped_total{"):
            reason = line.split('reason="')[1].split('"')[0]
            counts[reason] = float(line.rsplit(" ", 1)[1])
    return counts


@pytest.mark.parametrize("collector", ["silent", "failing"])
def test_a_collector_that_fails_costs_requests_nothing_but_dropped_spans(
    sim: TritonSim, redis_url: str, tmp_path: Path, collector: str
) -> None:
    """A collector that accepts connections and never answers, or answers 500: every
    request is served, and the spans that cannot go are dropped and counted (the queue
    is 8 spans: a request makes 5 or more)."""
    port = collector_port()
    silent = socket.create_server(("127.0.0.1", port), backlog=64)
    failing = None
    if collector == "failing":
        silent.close()
        failing = OtlpReceiver(SpanFile(None), port, status=500).start()
    tracing = {
        "endpoint": f"http://127.0.0.1:{port}/v1/traces",
        "max_queue_size": 8,
        "max_export_batch_size": 4,
        "schedule_delay_s": 0.05,
        "export_timeout_s": 0.5,
    }
    try:
        with running_gateway(
            tmp_path,
            models(sim),
            redis_url,
            tenants={"acme": tenant("acme", ["*"])},
            gateway={"tracing": tracing},
        ) as gw:
            client = OpenAI(base_url=gw.base_url, api_key=KEYS["acme"], max_retries=0)
            for _ in range(20):
                answer = client.chat.completions.create(
                    model="llm-small", messages=[{"role": "user", "content": "hi"}], max_tokens=2
                )
                assert answer.choices[0].message.content
            deadline = time.monotonic() + 30
            while not (counts := dropped(gw)).get("export_failed"):
                assert time.monotonic() < deadline, counts
                time.sleep(0.2)
            if collector == "silent":  # an export waits its timeout: the queue fills
                assert counts["queue_full"] > 0
    finally:
        silent.close()
        if failing is not None:
            failing.stop()
