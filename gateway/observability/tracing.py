"""Traces: a request's way through the gateway as OpenTelemetry spans, sent over OTLP.

Off unless gateway.yaml's `tracing:` or the standard `OTEL_*` environment turns it on
(`trace_settings`). Off, nothing of OpenTelemetry is imported, and a request pays for one
`is None` test at each step.

On, sampling is decided here before any span exists, so an unsampled request costs a
random draw and no more. A client's `traceparent` is joined: its trace id is kept, and its
sampled flag honoured (with a parent-based sampler) up to `client_sampled_per_second`,
past which the configured ratio decides, so that a client cannot make the gateway trace
all it sends. A malformed or oversized `traceparent` or `tracestate` is ignored, never
logged (it is the client's text), never an error.

A traced request has a server span (`RequestTrace`), and under it a span or an event for
each step that can take time; an upstream attempt's context is what the backends send on
(`upstream_traceparent`: HTTP headers, gRPC metadata), so a Triton server that traces
puts its spans under the gateway's. Which request is being served is a context variable,
set as the request arrives: the layers below find their parent span there, not in their
arguments.

Finished spans go to a bounded queue, and a thread exports them (`trace_export`): the
request path never waits for a collector.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

# OpenTelemetry's API only (the SDK and the exporters are `trace_export`'s, imported when
# tracing starts); imported here once, not in each call: an import statement in a
# function costs a traced request a microsecond each time.
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    Tracer,
    set_span_in_context,
)
from opentelemetry.trace.span import TraceState

from gateway.observability.trace_settings import TracingSettings

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import Span as Span

log = logging.getLogger("gateway.tracing")

# The attribute values a span takes (OpenTelemetry's `AttributeValue`).
Attribute = str | bool | int | float | Sequence[str] | Sequence[int] | Sequence[float]
Attributes = Mapping[str, Attribute]

# W3C Trace Context: version 00's traceparent is 55 characters; a later version may add
# fields, which version 00's parser reads past. A header longer than this is not read.
_TRACEPARENT_MAX = 256
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
# tracestate: at most 32 members (more: the header is dropped), and the first 512
# characters' whole members kept, as the W3C lets a vendor cut it.
_TRACESTATE_MEMBERS = 32
_TRACESTATE_KEPT = 512
_TRACESTATE_READ = 8192
# A simple key starts with a letter; a multi-tenant one's tenant may start with a digit
# (W3C; OpenTelemetry's TraceState logs each member it refuses: none may reach it).
_TRACESTATE_MEMBER = re.compile(
    r"([a-z][_0-9a-z\-*/]{0,255}|[a-z0-9][_0-9a-z\-*/]{0,240}@[a-z][_0-9a-z\-*/]{0,13})"
    r"=([\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e])"
)


@dataclass(frozen=True, slots=True)
class Parent:
    """A client's trace context, as its `traceparent` and `tracestate` said."""

    trace_id: int
    span_id: int
    sampled: bool
    # The tracestate members kept, in order.
    state: tuple[tuple[str, str], ...] = ()


def parse_parent(traceparent: str | None, tracestate: str | None) -> Parent | None:
    """The client's trace context, or None when `traceparent` is absent, malformed, too
    long or invalid (an all-zero id, version ff). A `tracestate` that is malformed or
    has more than 32 members is left out; a long one is cut to its first 512
    characters' whole members."""
    if not traceparent or len(traceparent) > _TRACEPARENT_MAX:
        return None
    match = _TRACEPARENT.fullmatch(traceparent.strip())
    if match is None:
        return None
    version, trace_hex, span_hex, flags_hex, rest = match.groups()
    if version == "ff" or (version == "00" and rest):
        return None
    trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)
    if trace_id == 0 or span_id == 0:
        return None
    sampled = bool(int(flags_hex, 16) & 1)
    return Parent(trace_id, span_id, sampled, _parse_state(tracestate))


def _parse_state(header: str | None) -> tuple[tuple[str, str], ...]:
    if not header or len(header) > _TRACESTATE_READ:
        return ()
    members = [m.strip(" \t") for m in header.split(",")]
    members = [m for m in members if m]
    if len(members) > _TRACESTATE_MEMBERS:
        return ()
    kept: list[tuple[str, str]] = []
    seen: set[str] = set()
    length = 0
    for member in members:
        match = _TRACESTATE_MEMBER.fullmatch(member)
        if match is None:
            return ()
        key, value = match.groups()
        if key in seen:
            return ()
        seen.add(key)
        length += len(member) + (1 if kept else 0)
        if length <= _TRACESTATE_KEPT:
            kept.append((key, value))
    return tuple(kept)


class Sampler:
    """Which requests are traced: the ratio, and a client's sampled flag within a rate."""

    def __init__(
        self,
        ratio: float,
        parent_based: bool,
        client_per_second: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ratio = ratio
        self._parent_based = parent_based
        self._rate = client_per_second
        self._allowance = client_per_second
        self._clock = clock
        self._checked = clock()

    def sampled(self, parent: Parent | None) -> bool:
        if parent is None:
            return self._ratio >= 1.0 or random.random() < self._ratio
        if self._parent_based:
            if not parent.sampled:
                return False
            if self._ratio >= 1.0 or self._client_may():
                return True
        # The ratio, by a draw of the gateway's own: not on the trace id, as W3C
        # participants do, since the client chose it (and could choose one that passes).
        return random.random() < self._ratio

    def _client_may(self) -> bool:
        now = self._clock()
        self._allowance = min(self._rate, self._allowance + (now - self._checked) * self._rate)
        self._checked = now
        if self._allowance >= 1.0:
            self._allowance -= 1.0
            return True
        return False


class _Tracing:
    """The process's tracer, once `start` has run: OpenTelemetry's SDK, imported now."""

    def __init__(self, config: TracingSettings) -> None:
        from gateway.observability import trace_export

        self.sampler = Sampler(config.ratio, config.parent_based, config.client_sampled_per_second)
        self.provider = trace_export.provider(config)
        self.tracer: Tracer = self.provider.get_tracer("inference-gateway")


_tracing: _Tracing | None = None


def start(config: TracingSettings) -> None:
    """Trace requests from now on, as `config` says (replacing an earlier start)."""
    global _tracing
    stop()
    _tracing = _Tracing(config)
    log.info(
        "tracing on: OTLP %s to %s, sampling %g%s",
        config.protocol,
        config.endpoint,
        config.ratio,
        " (parent-based)" if config.parent_based else "",
    )


def stop() -> None:
    """Export what is queued (`trace_export.BoundedExport.shutdown`) and trace no more."""
    global _tracing
    current, _tracing = _tracing, None
    if current is not None:
        current.provider.shutdown()


def enabled() -> bool:
    """Whether requests are traced (some of them, by the sampler)."""
    return _tracing is not None


# The request the current task serves, and the span new steps go under.
_CURRENT: ContextVar[tuple[RequestTrace, Span] | None] = ContextVar("gateway_trace", default=None)
# The header (and gRPC metadata key) a context goes upstream in (W3C Trace Context).
TRACEPARENT_HEADER = "traceparent"
# The upstream attempt the current task is making: its `traceparent`.
_UPSTREAM: ContextVar[str | None] = ContextVar("gateway_upstream_trace", default=None)


def begin_request(operation: str, headers: Iterable[tuple[bytes, bytes]]) -> RequestTrace | None:
    """The server span of a request that has just arrived with `headers` (ASGI's: names
    in lower case), if it is traced (else None), made the current task's; `operation`
    is its GenAI operation (`chat`, ...)."""
    tracing = _tracing
    if tracing is None:
        return None
    # The raw headers read once: Starlette's `Headers` cost a request a microsecond or two.
    traceparent: str | None = None
    states: list[str] = []
    for name, value in headers:
        if name == b"traceparent":
            # Two are no context at all (W3C): an empty one parses as none.
            traceparent = "" if traceparent is not None else value.decode("latin-1")
        elif name == b"tracestate":
            states.append(value.decode("latin-1"))
    parent = parse_parent(traceparent, ",".join(states) if states else None)
    if not tracing.sampler.sampled(parent):
        # Set even so: a task made from one that served a traced request (a keep-alive
        # connection's next, say) starts with a copy of that one's context.
        _CURRENT.set(None)
        return None
    trace = RequestTrace(tracing.tracer, operation, parent)
    _CURRENT.set((trace, trace.span))
    return trace


def begin_task(name: str) -> RequestTrace | None:
    """A trace of its own for a piece of the gateway's own work (a placement, a closed
    loop's interval), if tracing is on: not sampled (there are few), never a client's."""
    tracing = _tracing
    if tracing is None:
        return None
    return RequestTrace(tracing.tracer, name, None, server=False)


def step(
    trace: RequestTrace | None, name: str, started: float, attributes: Attributes | None = None
) -> None:
    """`trace.step`, when there is a trace."""
    if trace is not None:
        trace.step(name, started, attributes)


def current() -> RequestTrace | None:
    """The traced request the current task serves, if any."""
    scope = _CURRENT.get()
    return None if scope is None else scope[0]


def upstream_traceparent() -> str | None:
    """The `traceparent` to send with the upstream call being made now, if traced."""
    return _UPSTREAM.get()


def wall_ns(monotonic_s: float) -> int:
    """A `time.monotonic()` instant as the epoch nanoseconds spans are stamped with."""
    return time.time_ns() - int((time.monotonic() - monotonic_s) * 1e9)


class RequestTrace:
    """One traced request: its server span, and the spans and events of its steps (or
    a task's, `begin_task`: its root span and its steps)."""

    __slots__ = ("_tracer", "operation", "span", "span_id", "trace_id")

    def __init__(
        self, tracer: Tracer, operation: str, parent: Parent | None, *, server: bool = True
    ) -> None:
        self._tracer = tracer
        self.operation = operation
        context = None
        if parent is not None:
            remote = SpanContext(
                parent.trace_id,
                parent.span_id,
                is_remote=True,
                trace_flags=TraceFlags(TraceFlags.SAMPLED),
                trace_state=TraceState(list(parent.state)),
            )
            context = set_span_in_context(NonRecordingSpan(remote))
        kind = SpanKind.SERVER if server else SpanKind.INTERNAL
        self.span: Span = tracer.start_span(  # type: ignore[assignment]
            operation, context=context, kind=kind
        )
        ids = self.span.get_span_context()
        self.trace_id = f"{ids.trace_id:032x}"
        self.span_id = f"{ids.span_id:016x}"

    def child(
        self,
        name: str,
        attributes: Attributes | None = None,
        *,
        parent: Span | None = None,
        start_ns: int | None = None,
        client: bool = False,
    ) -> Span:
        """A span of one step, under `parent` (the current step's, else the request's)."""
        if parent is None:
            scope = _CURRENT.get()
            parent = scope[1] if scope is not None and scope[0] is self else self.span
        return self._tracer.start_span(  # type: ignore[return-value]
            name,
            context=set_span_in_context(parent),
            kind=SpanKind.CLIENT if client else SpanKind.INTERNAL,
            attributes=attributes,
            start_time=start_ns,
        )

    def step(self, name: str, started: float, attributes: Attributes | None = None) -> None:
        """A step that is over: from `started` (monotonic seconds) to now."""
        self.child(name, attributes, start_ns=wall_ns(started)).end()

    def upstream(self, model: str, url: str, protocol: str, attempt: int) -> UpstreamAttempt:
        """A call to the replica at `url`, the `attempt`th for this model (1: the first;
        later ones are failovers), under the current step (the model's)."""
        attributes = dict(_replica_attributes(model, url, protocol))
        attributes["gateway.replica_attempt"] = attempt
        return UpstreamAttempt(self.child(f"gateway.upstream {model}", attributes, client=True))

    def enter(self, span: Span) -> None:
        """Steps started from now on in this task go under `span`."""
        _CURRENT.set((self, span))

    def event(self, name: str, attributes: Attributes | None = None) -> None:
        """Something that happened to the request, now."""
        self.span.add_event(name, attributes)

    def end(self, name: str, attributes: Attributes, error: str | None = None) -> None:
        """The request has ended: its span's name (`chat llm-large`), last attributes,
        and its error if it failed."""
        self.span.update_name(name)
        end_span(self.span, error, attributes)


@functools.lru_cache(maxsize=1024)
def _replica_attributes(model: str, url: str, protocol: str) -> tuple[tuple[str, Attribute], ...]:
    """A replica's attributes: the same for each of its calls (the URL read once)."""
    where = urlsplit(url if "://" in url else f"grpc://{url}")
    attributes: list[tuple[str, Attribute]] = [
        ("gateway.model", model),
        ("gateway.replica", url),
        ("gateway.protocol", protocol),
    ]
    if where.hostname:
        attributes.append(("server.address", where.hostname))
    if where.port:
        attributes.append(("server.port", where.port))
    return tuple(attributes)


class UpstreamAttempt:
    """A call to one replica, as a client span (`RequestTrace.upstream`): the upstream
    call made within the block carries its context. Ended when the block ends: failed
    if `failed` said so or an exception left it, cut if it was cancelled or closed."""

    __slots__ = ("span",)

    def __init__(self, span: Span) -> None:
        self.span = span

    def __enter__(self) -> UpstreamAttempt:
        ids = self.span.get_span_context()
        _UPSTREAM.set(f"00-{ids.trace_id:032x}-{ids.span_id:016x}-01")
        return self

    def __exit__(
        self, typ: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        _UPSTREAM.set(None)
        if typ is not None:
            if issubclass(typ, GeneratorExit | asyncio.CancelledError):
                self.span.set_attribute("gateway.upstream.cut", True)
            elif exc is not None:
                self.failed(exc)
        self.span.end()

    def failed(self, exc: BaseException) -> None:
        """The replica's failure: its kind only (an upstream's message may quote the
        request)."""
        self.span.set_attribute("error.type", type(exc).__name__)
        self.span.set_status(Status(StatusCode.ERROR, type(exc).__name__))

    def first_piece(self) -> None:
        """Its first piece has come (a stream's time to first token)."""
        self.span.add_event("gen_ai.first_token")


def end_span(span: Span, error: str | None = None, attributes: Attributes | None = None) -> None:
    """End a step's span, as failed with `error` when there is one."""
    if attributes:
        span.set_attributes(attributes)
    if error is not None:
        span.set_status(Status(StatusCode.ERROR, error))
    span.end()
