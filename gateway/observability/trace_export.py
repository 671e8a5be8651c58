"""Where finished spans go: OpenTelemetry's SDK, an OTLP exporter, and a bounded queue.

Imported only once tracing is on (`tracing.start`): a gateway that does not trace loads
none of OpenTelemetry. The SDK's own batch processor logs a warning for each span it
drops and counts drops only in OpenTelemetry's metrics; `BoundedExport` counts them in
the gateway's (`gateway_trace_spans_dropped_total`) and never logs on the request path.
"""

from __future__ import annotations

import threading
from collections import deque

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_ON

from gateway.observability import metrics
from gateway.observability.trace_settings import GRPC, TracingSettings

# The longest a stopping gateway waits for its last spans to go.
SHUTDOWN_WAIT_S = 5.0


def provider(config: TracingSettings) -> TracerProvider:
    """A tracer provider exporting as `config` says. The gateway samples before it, so it
    records every span it is asked for: left to itself it would read
    `OTEL_TRACES_SAMPLER` and sample the sampled requests a second time."""
    made = TracerProvider(
        sampler=ALWAYS_ON, resource=Resource.create(dict(config.resource_attributes))
    )
    made.add_span_processor(BoundedExport(exporter(config), config))
    return made


def exporter(config: TracingSettings) -> SpanExporter:
    """The OTLP exporter of `config.protocol`: HTTP (protobuf) or gRPC."""
    headers = None if config.headers is None else dict(config.headers)
    if config.protocol == GRPC:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcSpanExporter,
        )

        return GrpcSpanExporter(
            endpoint=config.endpoint,
            insecure=config.endpoint.startswith("http://"),
            headers=headers,
            timeout=config.export_timeout_s,
        )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(
        endpoint=config.endpoint, headers=headers, timeout=config.export_timeout_s
    )


class BoundedExport(SpanProcessor):
    """Finished spans into a bounded queue, exported by a thread in batches. A full
    queue or a failed export (the exporter's own retries spent) drops spans, counted by
    reason: a dead or slow collector costs the request path nothing."""

    def __init__(self, exporter: SpanExporter, config: TracingSettings) -> None:
        self._exporter = exporter
        self._queue: deque[ReadableSpan] = deque()
        self._max = config.max_queue_size
        self._batch = config.max_export_batch_size
        self._delay = config.schedule_delay_s
        # How long a shutdown waits for the last export: a collector that does not
        # answer must not hold a stopping gateway long (its spans are lost then).
        self._last_export_s = min(config.export_timeout_s + 1.0, SHUTDOWN_WAIT_S)
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="gateway-trace-export", daemon=True)
        self._thread.start()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        # deque's append and len are atomic: no lock on the request path.
        if len(self._queue) >= self._max:
            metrics.TRACE_SPANS_DROPPED.labels("queue_full").inc()
            return
        self._queue.append(span)
        if len(self._queue) >= self._batch:
            self._wake.set()

    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(self._delay)
            self._wake.clear()
            self._export_queued()
        self._export_queued()

    def _export_queued(self) -> None:
        queue = self._queue
        while queue:
            batch = [queue.popleft() for _ in range(min(self._batch, len(queue)))]
            try:
                result = self._exporter.export(batch)
            except Exception:  # an exporter's bug must not end the export thread
                result = SpanExportResult.FAILURE
            if result is SpanExportResult.SUCCESS:
                metrics.TRACE_SPANS_EXPORTED.inc(len(batch))
            else:
                metrics.TRACE_SPANS_DROPPED.labels("export_failed").inc(len(batch))
            if self._stopping and result is not SpanExportResult.SUCCESS:
                # Shutting down with the collector failing: what is left is dropped.
                metrics.TRACE_SPANS_DROPPED.labels("export_failed").inc(len(queue))
                queue.clear()

    def shutdown(self) -> None:
        """Export what is queued (within the exporter's timeout), then stop."""
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout=self._last_export_s)
        self._exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Export what is queued now (returns at once; the thread does it)."""
        self._wake.set()
        return True
