"""`gateway traces`: a request's spans as a waterfall in the terminal.

Reads the spans the demo's OTLP receiver wrote (`otlp_receiver.SpanFile`): the gateway's
and Triton's, joined by their trace ids. Each trace prints as a tree, each span on one
line: when it started (ms after the trace's first span), how long it took, a bar on the
trace's time line, its name and service, and the attributes that say what happened.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from gateway_tools.dev.otlp_receiver import Span

# The attributes worth a place on a span's line, in this order, under a short name.
_SHOWN = (
    ("http.response.status_code", "status"),
    ("gateway.outcome", "outcome"),
    ("gateway.tenant", "tenant"),
    ("gen_ai.response.model", "served"),
    ("gateway.fallbacks", "fallbacks"),
    ("gen_ai.usage.input_tokens", "in"),
    ("gen_ai.usage.output_tokens", "out"),
    ("gateway.ratelimit.allowed", "allowed"),
    ("gateway.ratelimit.refused_by", "refused_by"),
    ("gateway.queue.outcome", "queue"),
    ("gateway.model.outcome", "outcome"),
    ("gateway.replica", "replica"),
    ("gateway.protocol", "protocol"),
    ("gateway.replica_attempt", "attempt"),
    ("error.type", "error"),
    ("gateway.upstream.cut", "cut"),
    ("model_name", "model"),
    ("triton.model_name", "model"),
)
_BAR = 32


def traces(spans: Iterable[Span]) -> dict[str, list[Span]]:
    """Spans by trace id, each trace in the order its spans started."""
    by_trace: dict[str, list[Span]] = defaultdict(list)
    for span in spans:
        by_trace[span.trace_id].append(span)
    for members in by_trace.values():
        members.sort(key=lambda s: s.start_ns)
    return dict(sorted(by_trace.items(), key=lambda item: item[1][0].start_ns))


def chosen(
    all_traces: dict[str, list[Span]],
    trace_id: str | None,
    request_id: str | None,
    last: int,
    *,
    own_work: bool = False,
) -> list[list[Span]]:
    """The traces asked for: by trace id (or its prefix), by the gateway's request id (the
    `x-request-id` a client got), else the last `last` requests' (with `own_work`, the
    gateway's own work's too: placements, the closed loop's intervals)."""
    if trace_id:
        return [spans for tid, spans in all_traces.items() if tid.startswith(trace_id.lower())]
    if request_id:
        return [
            spans
            for spans in all_traces.values()
            if any(s.attributes.get("gateway.request_id") == request_id for s in spans)
        ]
    shown = [spans for spans in all_traces.values() if own_work or _of_a_request(spans)]
    return shown[-last:] if last > 0 else []


def _of_a_request(spans: list[Span]) -> bool:
    return any("gateway.request_id" in s.attributes for s in spans)


def waterfall(spans: Sequence[Span]) -> str:
    """One trace as a tree of spans on its time line."""
    start = min(s.start_ns for s in spans)
    end = max(s.end_ns for s in spans)
    total = max(end - start, 1)
    ids = {s.span_id for s in spans}
    children: dict[str, list[Span]] = defaultdict(list)
    roots: list[Span] = []
    for span in spans:
        if span.parent_span_id and span.parent_span_id in ids:
            children[span.parent_span_id].append(span)
        else:
            roots.append(span)
    services = sorted({s.service for s in spans if s.service})
    head = roots[0] if roots else spans[0]
    lines = [
        f"trace {spans[0].trace_id}  {head.name}  {total / 1e6:,.1f} ms  "
        f"{len(spans)} spans from {', '.join(services)}",
        f"{'start ms':>10} {'took ms':>9}  {'':{_BAR}}  span",
    ]

    def add(span: Span, depth: int) -> None:
        offset, took = span.start_ns - start, max(span.end_ns - span.start_ns, 0)
        first = int(offset / total * _BAR)
        width = max(1, round(took / total * _BAR))
        bar = (" " * first + "█" * width)[:_BAR]
        failed = "  ✗ " + (span.status_message or "error") if span.status == 2 else ""
        service = f" [{span.service}]" if span.service and depth == 0 else ""
        lines.append(
            f"{offset / 1e6:>10.1f} {took / 1e6:>9.1f}  {bar:<{_BAR}}  "
            f"{'  ' * depth}{span.name}{service}{_summary(span)}{failed}"
        )
        indent = "  " * (depth + 1)
        for at, name, detail in _events(span, start):
            lines.append(f"{at:>10.1f} {'':>9}  {'':{_BAR}}  {indent}· {name}{detail}")
        for child in sorted(children[span.span_id], key=lambda s: s.start_ns):
            add(child, depth + 1)

    for root in roots:
        add(root, 0)
    return "\n".join(lines)


def _summary(span: Span) -> str:
    shown = []
    for key, label in _SHOWN:
        value = span.attributes.get(key)
        if value is None or value == "":
            continue
        if isinstance(value, list):
            value = ",".join(str(v) for v in value)
        shown.append(f"{label}={value}")
    return ("  " + " ".join(shown)) if shown else ""


def _events(span: Span, start: int) -> list[tuple[float, str, str]]:
    """A span's events as lines: (ms after the trace's start, name, detail). Events of
    one kind in a row (a stream's responses) are one line with their count (`x5`); events
    stamped outside their span (Triton 2.51 stamps HTTP_SEND_* and GRPC_WAITREAD_START
    on another clock) are left out."""
    shown: list[tuple[float, str, str]] = []
    counts: list[int] = []
    for event in span.events:
        at = event["time_ns"]
        if not span.start_ns - 1_000_000 <= at <= span.end_ns + 1_000_000:
            continue
        name = event["name"]
        if shown and shown[-1][1] == name and not event.get("attributes"):
            counts[-1] += 1
            continue
        shown.append(((at - start) / 1e6, name, _event_detail(event.get("attributes") or {})))
        counts.append(1)
    return [
        (at, name, detail + (f"  x{count}" if count > 1 else ""))
        for (at, name, detail), count in zip(shown, counts, strict=True)
    ]


def _event_detail(attributes: dict[str, object]) -> str:
    parts = [
        f"{key.rsplit('.', 1)[-1]}={value}" for key, value in attributes.items() if value != ""
    ]
    return ("  " + " ".join(parts)) if parts else ""


def run_traces(
    path: str, trace_id: str | None, request_id: str | None, last: int, own_work: bool
) -> int:
    """`gateway traces`: print the traces asked for; 1 when there is none."""
    import os
    import sys

    from gateway_tools.dev.otlp_receiver import read_spans

    try:
        spans = read_spans(path)
    except FileNotFoundError:
        print(
            f"traces: {path}: no such file. The demo prints its spans file on its "
            "`Traces:` line; pass it with --file",
            file=sys.stderr,
        )
        return 1
    found = chosen(traces(spans), trace_id, request_id, last, own_work=own_work)
    if not found:
        why = (
            " (a request is traced only when sampled; Triton's spans come seconds later)"
            if trace_id or request_id
            else ""
        )
        print(f"traces: no trace matches{why}", file=sys.stderr)
        return 1
    try:
        print("\n\n".join(waterfall(trace) for trace in found), flush=True)
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
