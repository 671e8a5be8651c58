"""Tracing's settings, a client's trace context, the sampler and the bounded export
(gateway/observability/tracing.py, trace_export.py); the spans themselves are checked
end to end against an OTLP receiver and a real Triton in tests/e2e/test_tracing.py."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from opentelemetry.trace.span import TraceState

from gateway.observability import metrics, tracing
from gateway.observability.access import RequestRecord
from gateway.observability.trace_export import BoundedExport
from gateway.observability.trace_settings import TracingError, TracingSettings, settings
from gateway.observability.tracing import Parent, RequestTrace, Sampler, parse_parent
from tests.unit.config.test_loader import GATEWAY, problems

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"


# -- settings: gateway.yaml over the standard environment ----------------------------------


def test_tracing_is_off_without_an_endpoint_anywhere() -> None:
    assert settings({}, {}) is None
    assert settings({}, {"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"}) is None


def test_the_standard_environment_alone_turns_it_on() -> None:
    on = settings(
        {},
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/",
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0.01",
            "OTEL_SERVICE_NAME": "edge-gateway",
            "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod,team=ml%20platform",
        },
    )
    assert on is not None
    # The signal's path is added to the base endpoint for HTTP, as the specification says.
    assert on.endpoint == "http://collector:4318/v1/traces"
    assert (on.protocol, on.ratio, on.parent_based) == ("http/protobuf", 0.01, True)
    assert on.resource_attributes == {
        "deployment.environment": "prod",
        "team": "ml platform",
        "service.name": "edge-gateway",
    }


def test_a_traces_endpoint_is_taken_as_it_is_and_grpc_keeps_the_base() -> None:
    traces = settings({}, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:9999/custom"})
    assert traces is not None and traces.endpoint == "http://c:9999/custom"
    grpc = settings(
        {}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    )
    assert grpc is not None and (grpc.endpoint, grpc.protocol) == ("http://c:4317", "grpc")


def test_the_environment_can_turn_it_off_and_gateway_yaml_overrides_both_ways() -> None:
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}
    assert settings({}, {**endpoint, "OTEL_SDK_DISABLED": "true"}) is None
    assert settings({}, {**endpoint, "OTEL_TRACES_EXPORTER": "none"}) is None
    assert settings({"enabled": False}, endpoint) is None
    forced = settings({"enabled": True}, {})
    assert forced is not None and forced.endpoint == "http://localhost:4318/v1/traces"
    # An endpoint in gateway.yaml is enough, and wins over the environment's.
    given = settings({"endpoint": "http://mine:4318/v1/traces"}, endpoint)
    assert given is not None and given.endpoint == "http://mine:4318/v1/traces"


def test_gateway_yaml_wins_over_the_environment_key_by_key() -> None:
    chosen = settings(
        {"sampler": "traceidratio", "sampler_arg": 0.5, "service_name": "gw", "max_queue_size": 7},
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
            "OTEL_TRACES_SAMPLER": "always_on",
            "OTEL_SERVICE_NAME": "other",
        },
    )
    assert chosen is not None
    assert (chosen.ratio, chosen.parent_based) == (0.5, False)
    assert chosen.resource_attributes["service.name"] == "gw"
    assert chosen.max_queue_size == 7


def test_the_service_is_named_when_nothing_names_it() -> None:
    on = settings({"enabled": True}, {})
    assert on is not None and on.resource_attributes["service.name"] == "inference-gateway"


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({"OTEL_TRACES_SAMPLER_ARG": "lots", "OTEL_TRACES_SAMPLER": "traceidratio"}, "SAMPLER_ARG"),
        ({"OTEL_TRACES_SAMPLER_ARG": "1.5", "OTEL_TRACES_SAMPLER": "traceidratio"}, "SAMPLER_ARG"),
        ({"OTEL_TRACES_SAMPLER": "jaeger_remote"}, "OTEL_TRACES_SAMPLER"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
    ],
)
def test_an_environment_value_that_cannot_be_used_is_refused_by_name(
    environ: dict[str, str], named: str
) -> None:
    with pytest.raises(TracingError, match=named):
        settings({"enabled": True}, environ)


def test_the_batch_processor_s_standard_variables_set_the_export_queue() -> None:
    on = settings(
        {"max_queue_size": 64},
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
            "OTEL_BSP_MAX_QUEUE_SIZE": "4096",
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "128",
            "OTEL_BSP_SCHEDULE_DELAY": "250",
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "3000",
        },
    )
    assert on is not None
    # Milliseconds, as the specification has them; gateway.yaml wins.
    assert (on.max_queue_size, on.max_export_batch_size) == (64, 128)
    assert (on.schedule_delay_s, on.export_timeout_s) == (0.25, 3.0)


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({"OTEL_BSP_SCHEDULE_DELAY": "9300000000000"}, "OTEL_BSP_SCHEDULE_DELAY"),
        ({"OTEL_EXPORTER_OTLP_TIMEOUT": "600001"}, "OTEL_EXPORTER_OTLP_TIMEOUT"),
        ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"),
        (
            {"OTEL_EXPORTER_OTLP_CERTIFICATE": "/nonexistent/ca.pem"},
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
        ),
        ({"OTEL_BSP_MAX_QUEUE_SIZE": "-1"}, "OTEL_BSP_MAX_QUEUE_SIZE"),
        ({"OTEL_BSP_SCHEDULE_DELAY": "1s"}, "OTEL_BSP_SCHEDULE_DELAY"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, "OTEL_EXPORTER_OTLP_ENDPOINT"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "ftp://x/y"}, "OTEL_EXPORTER_OTLP_ENDPOINT"),
    ],
)
def test_a_bad_export_variable_is_refused_by_name(environ: dict[str, str], named: str) -> None:
    with pytest.raises(TracingError, match=named):
        settings({"enabled": True}, environ)


def test_a_malformed_headers_variable_is_refused_without_showing_its_secret(
    caplog: pytest.LogCaptureFixture,
) -> None:
    secret = "hcaik_01hzsecretsecretsecret"
    environ = {"OTEL_EXPORTER_OTLP_HEADERS": f"x-honeycomb-team:{secret}"}
    with pytest.raises(TracingError) as refused:
        settings({"enabled": True}, environ)
    assert str(refused.value).startswith("OTEL_EXPORTER_OTLP_HEADERS: member 1 is not name=value")
    assert secret not in str(refused.value) and not caplog.records
    good = {"OTEL_EXPORTER_OTLP_HEADERS": f"x-honeycomb-team={secret},x-b=c%20d"}
    assert settings({"enabled": True}, good) is not None


def test_gateway_yaml_refuses_a_bad_tracing_section_at_its_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    tracing = (
        "tracing:\n  sampler_arg: 2\n  protocol: http/json\n  endpont: http://x\n"
        "  endpoint: collector:4318\n  max_queue_size: 0\n  schedule_delay_s: .inf\n"
    )
    found = problems(gateway=GATEWAY + tracing)
    assert found[:3] == [
        "gateway.yaml:11: tracing.sampler_arg: Input should be less than or equal to 1",
        "gateway.yaml:12: tracing.protocol: Input should be 'http/protobuf' or 'grpc'",
        "gateway.yaml:13: tracing: unknown key 'endpont'",
    ]
    assert found[3].startswith("gateway.yaml:14: tracing.endpoint: String should match pattern")
    assert (
        found[4]
        == "gateway.yaml:15: tracing.max_queue_size: Input should be greater than or equal to 1"
    )
    assert found[5].startswith("gateway.yaml:16: tracing.schedule_delay_s: Input should be")


# -- a client's trace context ---------------------------------------------------------------


def test_a_valid_traceparent_and_tracestate_are_read() -> None:
    parent = parse_parent(f"00-{TRACE}-{SPAN}-01", "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7")
    assert parent == Parent(
        int(TRACE, 16),
        int(SPAN, 16),
        True,
        (("congo", "t61rcWkgMzE"), ("rojo", "00f067aa0ba902b7")),
    )
    unsampled = parse_parent(f"00-{TRACE}-{SPAN}-00", None)
    assert unsampled is not None and not unsampled.sampled
    # A later version may add fields, which a version-00 reader reads past.
    assert parse_parent(f"01-{TRACE}-{SPAN}-01-what-comes-next", None) is not None


@pytest.mark.parametrize(
    "traceparent",
    [
        None,
        "",
        "00-" + "a" * 10_240,
        f"00-{TRACE}-{SPAN}-01" + "0" * 300,
        f"00-{TRACE.upper()}-{SPAN}-01",
        f"00-{'0' * 32}-{SPAN}-01",
        f"00-{TRACE}-{'0' * 16}-01",
        f"ff-{TRACE}-{SPAN}-01",
        f"00-{TRACE}-{SPAN}-01-extra",
        f"00-{TRACE}-{SPAN}",
        f"00_{TRACE}_{SPAN}_01",
        f"00-{TRACE}-{SPAN}-01, 00-{TRACE}-{SPAN}-01",
        "\x00\x01\x02",
    ],
)
def test_a_bad_traceparent_is_ignored(traceparent: str | None) -> None:
    assert parse_parent(traceparent, "a=b") is None


@pytest.mark.parametrize(
    ("tracestate", "kept"),
    [
        (",".join(f"k{i}=v" for i in range(1000)), ()),  # over 32 members: dropped
        ("a=1,a=2", ()),  # a key twice: dropped
        ("a=1,Bad=2", ()),  # a malformed member: the whole header dropped
        ("0abc=1", ()),  # a simple key starts with a letter
        ("0abc@vendor=1", (("0abc@vendor", "1"),)),  # a tenant's may start with a digit
        ("a=" + "v" * 10_000, ()),  # longer than any W3C header: not read
        ("a=1,,  ,b=2", (("a", "1"), ("b", "2"))),  # empty members are allowed
        # 600 characters of whole members: cut to the first 512's.
        (
            ",".join(f"k{i:02d}=" + "v" * 95 for i in range(6)),
            tuple((f"k{i:02d}", "v" * 95) for i in range(5)),
        ),
    ],
)
def test_a_tracestate_is_kept_only_when_valid_and_cut_to_512_characters(
    tracestate: str, kept: tuple[tuple[str, str], ...], caplog: pytest.LogCaptureFixture
) -> None:
    parent = parse_parent(f"00-{TRACE}-{SPAN}-01", tracestate)
    assert parent is not None and parent.state == kept
    # What is kept, OpenTelemetry takes without a word: the client's text is never logged.
    TraceState(list(parent.state))
    assert caplog.records == []


# -- the sampler ----------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def sampled_parent(trace_id: int) -> Parent:
    return Parent(trace_id, 1, True)


def test_a_client_cannot_make_the_gateway_trace_past_its_rate() -> None:
    clock = Clock()
    sampler = Sampler(0.0, True, client_per_second=5, clock=clock)
    burst = [sampler.sampled(sampled_parent(2**127 + i)) for i in range(1000)]
    assert sum(burst) == 5  # the rate's burst, then the ratio (0) decides
    clock.now += 1.0
    assert sum(sampler.sampled(sampled_parent(2**127 + i)) for i in range(1000)) == 5


def test_past_the_client_rate_a_chosen_trace_id_does_not_pass_the_ratio() -> None:
    """The ratio is drawn by the gateway, not read off the trace id: a client that picks
    ids a trace-id ratio would take (low bits near 0) gets the ratio like anyone."""
    sampler = Sampler(0.01, True, client_per_second=0, clock=Clock())
    crafted = [sampled_parent((i << 64) | 1) for i in range(1, 2001)]
    assert sum(sampler.sampled(p) for p in crafted) < 60  # about 20
    unsampled = Sampler(0.01, False, client_per_second=0, clock=Clock())
    assert sum(unsampled.sampled(Parent(p.trace_id, 1, False)) for p in crafted) < 60


def test_a_client_that_says_not_sampled_is_followed_by_a_parent_based_sampler() -> None:
    sampler = Sampler(1.0, True, client_per_second=100, clock=Clock())
    assert not sampler.sampled(Parent(5, 1, False))
    assert sampler.sampled(None)


def test_a_sampler_that_is_not_parent_based_takes_its_ratio_only() -> None:
    never = Sampler(0.0, False, client_per_second=100, clock=Clock())
    assert not any(never.sampled(sampled_parent(i + 1)) for i in range(100))
    always = Sampler(1.0, False, client_per_second=0, clock=Clock())
    assert always.sampled(Parent(5, 1, False))


def test_the_ratio_samples_about_its_share_of_new_traces() -> None:
    sampler = Sampler(0.1, True, client_per_second=0, clock=Clock())
    share = sum(sampler.sampled(None) for _ in range(20_000)) / 20_000
    assert 0.08 < share < 0.12


# -- the bounded export ---------------------------------------------------------------------


class Exporter(SpanExporter):
    """An exporter that hangs until released, or fails."""

    def __init__(self, result: SpanExportResult) -> None:
        self.result = result
        self.release = threading.Event()
        self.exported = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.release.wait()
        self.exported += len(spans)
        return self.result

    def shutdown(self) -> None:
        self.release.set()


def dropped(reason: str) -> float:
    return metrics.TRACE_SPANS_DROPPED.labels(reason)._value.get()


def config(**given: object) -> TracingSettings:
    base: dict[str, object] = {"endpoint": "http://unused", "max_queue_size": 100}
    return TracingSettings(
        **{**base, "max_export_batch_size": 10, "schedule_delay_s": 0.01, **given}
    )  # type: ignore[arg-type]


def test_a_collector_that_never_answers_drops_spans_past_the_queue_and_holds_no_more() -> None:
    exporter = Exporter(SpanExportResult.SUCCESS)
    export = BoundedExport(exporter, config())
    before = dropped("queue_full")
    span = ReadableSpan(name="s")
    for _ in range(10_000):
        export.on_end(span)
    # The thread holds one batch in its hung export; the queue the rest, at most 100.
    assert len(export._queue) <= 100
    assert dropped("queue_full") - before >= 10_000 - 100 - 10
    exporter.release.set()
    export.shutdown()
    assert exporter.exported + dropped("queue_full") - before == 10_000


def test_a_failed_export_drops_its_spans_and_counts_them() -> None:
    exporter = Exporter(SpanExportResult.FAILURE)
    exporter.release.set()
    before = dropped("export_failed")
    export = BoundedExport(exporter, config())
    for _ in range(25):
        export.on_end(ReadableSpan(name="s"))
    export.shutdown()
    assert dropped("export_failed") - before == 25


# -- what a request's server span holds -------------------------------------------------------


def traced_record(prompt: str | None) -> tuple[RequestRecord, InMemorySpanExporter]:
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    trace = RequestTrace(provider.get_tracer("test"), "chat", None)
    record = RequestRecord("chatcmpl-1", tenant="acme", model="llm", trace=trace, prompt=prompt)
    return record, exported


def test_a_prompt_enters_a_span_only_when_logged_and_then_redacted() -> None:
    record, exported = traced_record(prompt=None)
    record.finish(200)
    (span,) = exported.get_finished_spans()
    assert "gateway.prompt" not in (span.attributes or {})
    # server.log_prompts: the conductor puts the prompt in the record; the span gets it
    # through the log's redaction.
    record, exported = traced_record(prompt="my key is sk-proj-abcdefghijklmnopqrstuvwxyz012345")
    record.finish(200)
    (span,) = exported.get_finished_spans()
    prompt = str((span.attributes or {})["gateway.prompt"])
    assert "[REDACTED]" in prompt and "abcdefghijklmnop" not in prompt
    # A client's megabyte of prompt is 8 KiB of span: spans wait in the export queue.
    record, exported = traced_record(prompt="x" * 1_000_000)
    record.finish(200)
    (span,) = exported.get_finished_spans()
    assert len(str((span.attributes or {})["gateway.prompt"])) == 8192


def test_a_gateway_failure_is_an_error_span_and_a_client_s_is_not() -> None:
    record, exported = traced_record(prompt=None)
    record.finish(503, "upstream_unavailable")
    record2, exported2 = traced_record(prompt=None)
    record2.finish(429, "rate_tokens")
    (failed,) = exported.get_finished_spans()
    (refused,) = exported2.get_finished_spans()
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.status.description == "upstream_unavailable"
    assert refused.status.status_code is StatusCode.UNSET
    assert (refused.attributes or {})["gateway.outcome"] == "rate_tokens"
    assert failed.name == "chat llm"


def test_a_request_never_inherits_the_trace_of_the_one_before_it() -> None:
    """A task starts with a copy of its maker's context: a request served after a traced
    one in the same context (a keep-alive connection's next) must not add its steps to
    that one's trace."""
    tracing.start(TracingSettings("http://127.0.0.1:9/v1/traces", ratio=1.0, export_timeout_s=0.1))
    try:
        first = tracing.begin_request("chat", [])
        assert first is not None and tracing.current() is first
        # The next request: its client sent a context that says "not sampled".
        unsampled = f"00-{TRACE}-{SPAN}-00"

        async def next_request() -> tracing.RequestTrace | None:
            assert tracing.begin_request("chat", [(b"traceparent", unsampled.encode())]) is None
            return tracing.current()

        assert asyncio.run(next_request()) is None
    finally:
        tracing.stop()


def test_a_request_the_gateway_samples_is_recorded_whatever_the_sdk_would_sample(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The gateway's sampler decides, once: the SDK's own, which reads the same
    OTEL_TRACES_SAMPLER, must not sample its choice again."""
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.0")
    tracing.start(TracingSettings("http://127.0.0.1:9/v1/traces", export_timeout_s=0.1))
    try:
        traces = [tracing.begin_request("chat", []) for _ in range(20)]
        assert all(t is not None and t.span.is_recording() for t in traces)
    finally:
        tracing.stop()


def test_check_config_refuses_what_serve_would_refuse_in_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from gateway.cli import main

    monkeypatch.chdir(tmp_path)
    problems(gateway=GATEWAY)  # writes gateway.yaml and tenants.yaml
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "lots")
    assert main(["check-config", "--config", "gateway.yaml"]) == 1
    assert capsys.readouterr().out == (
        "environment: OTEL_TRACES_SAMPLER_ARG: 'lots' is not a number\n"
    )
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.25")
    assert main(["check-config", "--config", "gateway.yaml"]) == 0


def test_the_context_is_read_from_the_raw_headers_and_two_traceparents_are_none() -> None:
    tracing.start(TracingSettings("http://127.0.0.1:9/v1/traces", export_timeout_s=0.1))
    try:
        sampled = f"00-{TRACE}-{SPAN}-01".encode()
        joined = tracing.begin_request(
            "chat",
            [(b"traceparent", sampled), (b"tracestate", b"a=1"), (b"tracestate", b"b=2")],
        )
        assert joined is not None and joined.trace_id == TRACE
        assert list(joined.span.parent.trace_state.items()) == [("a", "1"), ("b", "2")]  # type: ignore[union-attr]
        twice = tracing.begin_request("chat", [(b"traceparent", sampled)] * 2)
        assert twice is not None and twice.trace_id != TRACE and twice.span.parent is None
    finally:
        tracing.stop()
