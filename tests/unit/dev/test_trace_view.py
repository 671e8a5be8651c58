"""`gateway traces`: which traces it shows, and a trace as a tree on its time line."""

from __future__ import annotations

from pathlib import Path

from gateway_tools.dev.otlp_receiver import Span, SpanFile, read_spans
from gateway_tools.dev.trace_view import chosen, run_traces, traces, waterfall

MS = 1_000_000


def span(
    trace: str, span_id: str, parent: str, name: str, start: int, end: int, **attrs: object
) -> Span:
    return Span(
        trace, span_id, parent, name, "inference-gateway", 1, start * MS, end * MS, dict(attrs)
    )


def request_trace(trace: str, request_id: str, at: int) -> list[Span]:
    return [
        span(trace, "01", "", "chat llm", at, at + 20, **{"gateway.request_id": request_id}),
        span(trace, "02", "01", "gateway.model llm", at + 1, at + 19),
        span(trace, "03", "02", "gateway.upstream llm", at + 2, at + 18, **{"error.type": "X"}),
    ]


def test_last_shows_requests_and_leaves_the_gateway_s_own_work_unless_asked() -> None:
    spans = [
        *request_trace("a" * 32, "chatcmpl-1", 0),
        *request_trace("b" * 32, "chatcmpl-2", 100),
        span("c" * 32, "09", "", "gateway.autoscale", 200, 201),
    ]
    found = traces(spans)
    assert [t[0].trace_id for t in chosen(found, None, None, 1)] == ["b" * 32]
    assert [t[0].trace_id for t in chosen(found, None, None, 1, own_work=True)] == ["c" * 32]
    assert [t[0].trace_id for t in chosen(found, None, "chatcmpl-1", 1)] == ["a" * 32]
    assert [t[0].trace_id for t in chosen(found, "AAAA", None, 1)] == ["a" * 32]


def test_a_trace_prints_as_a_tree_with_its_times() -> None:
    trace = request_trace("a" * 32, "chatcmpl-1", 0)
    trace[2].events = [
        {"name": "INFER_RESPONSE_COMPLETE", "time_ns": 5 * MS, "attributes": {}},
        {"name": "INFER_RESPONSE_COMPLETE", "time_ns": 6 * MS, "attributes": {}},
        {"name": "HTTP_SEND_START", "time_ns": -700_000 * MS, "attributes": {}},  # another clock
    ]
    lines = waterfall(trace).splitlines()
    assert lines[0].startswith(f"trace {'a' * 32}  chat llm  20.0 ms  3 spans")
    names = [line.split("  ")[-1] for line in lines[2:]]
    assert "chat llm [inference-gateway]" in lines[2]
    assert "  gateway.model llm" in lines[3]
    assert "    gateway.upstream llm  error=X" in lines[4]
    assert lines[5].rstrip().endswith("· INFER_RESPONSE_COMPLETE  x2")
    assert not [n for n in names if "HTTP_SEND_START" in n]


def test_the_command_reads_the_receiver_s_file(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "traces.jsonl"
    SpanFile(path).add(request_trace("a" * 32, "chatcmpl-1", 0))
    assert len(read_spans(path)) == 3
    assert run_traces(str(path), None, "chatcmpl-1", 1, False) == 0
    assert "gateway.upstream llm" in capsys.readouterr().out
    assert run_traces(str(path), None, "chatcmpl-unknown", 1, False) == 1
    assert "traced only when sampled" in capsys.readouterr().err
    assert run_traces(str(tmp_path / "none.jsonl"), None, None, 1, False) == 1
    assert "`Traces:` line" in capsys.readouterr().err
