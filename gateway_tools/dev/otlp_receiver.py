"""An OTLP trace receiver for the demo and the tests: spans in, one JSON line each out.

It speaks OTLP as the specification writes it, on the official protobuf definitions
(`opentelemetry-proto`): `POST /v1/traces` over HTTP, in protobuf (what the gateway's
exporter sends) or JSON (what Triton's exporter sends: hex ids, camelCase), and the
`TraceService/Export` gRPC call. No collector binary is packaged where this project
installs from, so the demo and the tests run this one; a deployment sends its spans to
an OpenTelemetry Collector, Jaeger or Tempo instead (docs/observability.md).

Each span is written as one line of JSON (`Span`'s fields) to a file that `gateway
traces` reads; the file is cut when it passes `max_bytes` (the older half is dropped).
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import threading
import zlib
from collections import deque
from collections.abc import Iterator, Mapping
from concurrent import futures
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

# The largest export body taken (an SDK's batch is far smaller).
MAX_BODY_BYTES = 16 * 1024 * 1024


@dataclass(slots=True)
class Span:
    """One span as received, ids in hex, times in epoch nanoseconds."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    service: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    # 0 unset, 1 ok, 2 error (OTLP's status codes).
    status: int = 0
    status_message: str = ""


def spans_of(request: Any) -> Iterator[Span]:
    """The spans of an `ExportTraceServiceRequest`."""
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        service = str(resource.get("service.name", ""))
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                yield Span(
                    trace_id=span.trace_id.hex(),
                    span_id=span.span_id.hex(),
                    parent_span_id=span.parent_span_id.hex(),
                    name=span.name,
                    service=service,
                    kind=int(span.kind),
                    start_ns=int(span.start_time_unix_nano),
                    end_ns=int(span.end_time_unix_nano),
                    attributes=_attributes(span.attributes),
                    events=[
                        {
                            "name": event.name,
                            "time_ns": int(event.time_unix_nano),
                            "attributes": _attributes(event.attributes),
                        }
                        for event in span.events
                    ],
                    status=int(span.status.code),
                    status_message=span.status.message,
                )


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, kind)


def parse_json_export(body: bytes) -> Any:
    """An OTLP/JSON export (hex ids, as the specification has them) as the protobuf
    message."""
    from google.protobuf import json_format  # type: ignore[import-untyped]
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    data = json.loads(body)
    for resource_spans in data.get("resourceSpans", data.get("resource_spans", [])):
        for scope_spans in resource_spans.get("scopeSpans", resource_spans.get("scope_spans", [])):
            for span in scope_spans.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId", "trace_id", "span_id"):
                    if span.get(key):
                        span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
                for link in span.get("links", []):
                    for key in ("traceId", "spanId"):
                        if link.get(key):
                            link[key] = base64.b64encode(bytes.fromhex(link[key])).decode()
    return json_format.ParseDict(data, ExportTraceServiceRequest(), ignore_unknown_fields=True)


class SpanFile:
    """Spans appended as JSON lines, from several threads, bounded in size; the last
    `kept` also in memory (`recent`)."""

    def __init__(
        self, path: str | os.PathLike[str] | None, max_bytes: int = 64 << 20, kept: int = 10_000
    ) -> None:
        self.path = None if path is None else Path(path)
        self.max_bytes = max_bytes
        self.received = 0
        self._recent: deque[Span] = deque(maxlen=kept)
        self._lock = threading.Lock()

    def recent(self) -> list[Span]:
        """The last spans received, oldest first."""
        with self._lock:
            return list(self._recent)

    def add(self, spans: list[Span]) -> None:
        with self._lock:
            self.received += len(spans)
            self._recent.extend(spans)
            if self.path is None or not spans:
                return
            lines = "".join(
                json.dumps(asdict(span), separators=(",", ":")) + "\n" for span in spans
            )
            with self.path.open("a", encoding="utf-8") as out:
                out.write(lines)
                size = out.tell()
            if size > self.max_bytes:
                kept = self.path.read_bytes()[size // 2 :]
                self.path.write_bytes(kept[kept.find(b"\n") + 1 :])


class OtlpReceiver:
    """The receiver: HTTP on `http_port`, gRPC on `grpc_port` when given."""

    def __init__(
        self,
        spans: SpanFile,
        http_port: int,
        grpc_port: int | None = None,
        host: str = "127.0.0.1",
        status: int = 200,
    ) -> None:
        self.spans = spans
        # What the HTTP side answers (tests: a collector that fails).
        self.status = status
        self._http = ThreadingHTTPServer((host, http_port), _handler(self))
        self._http.daemon_threads = True
        self.http_port = self._http.server_address[1]
        self.grpc_port = grpc_port
        self._grpc: Any = None
        if grpc_port is not None:
            self._grpc = _grpc_server(self, host, grpc_port)
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)

    def start(self) -> OtlpReceiver:
        self._thread.start()
        if self._grpc is not None:
            self._grpc.start()
        return self

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        if self._grpc is not None:
            self._grpc.stop(0)


def _handler(receiver: OtlpReceiver) -> type[BaseHTTPRequestHandler]:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            if self.path.split("?")[0] != "/v1/traces":
                return self._answer(404, b"", "text/plain")
            length = int(self.headers.get("content-length") or 0)
            if length > MAX_BODY_BYTES:
                return self._answer(413, b"", "text/plain")
            body = self.rfile.read(length)
            encoding = self.headers.get("content-encoding", "")
            if encoding == "gzip":
                body = gzip.decompress(body)
            elif encoding == "deflate":
                body = zlib.decompress(body)
            kind = self.headers.get("content-type", "").split(";")[0].strip()
            if receiver.status != 200:
                return self._answer(receiver.status, b"", "text/plain")
            try:
                if kind == "application/json":
                    request = parse_json_export(body)
                else:
                    request = ExportTraceServiceRequest.FromString(body)
            except Exception:
                return self._answer(400, b"", "text/plain")
            receiver.spans.add(list(spans_of(request)))
            if kind == "application/json":
                return self._answer(200, b"{}", kind)
            return self._answer(200, b"", "application/x-protobuf")

        def _answer(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # one line per export would drown the demo's output

    return Handler


def _grpc_server(receiver: OtlpReceiver, host: str, port: int) -> Any:
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    class Service(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:
            receiver.spans.add(list(spans_of(request)))
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(f"{host}:{port}")
    return server


def read_spans(path: str | os.PathLike[str]) -> list[Span]:
    """The spans a `SpanFile` holds (a line cut short by a crash is skipped)."""
    spans: list[Span] = []
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            try:
                data: Mapping[str, Any] = json.loads(line)
                spans.append(Span(**data))
            except (ValueError, TypeError):
                continue
    return spans


def run_receiver(http_port: int, grpc_port: int | None, path: str | None) -> int:
    """`gateway otlp-receiver`: receive until interrupted."""
    receiver = OtlpReceiver(SpanFile(path), http_port, grpc_port).start()
    where = f"http://127.0.0.1:{http_port}/v1/traces"
    if grpc_port is not None:
        where += f" and gRPC 127.0.0.1:{grpc_port}"
    print(f"otlp-receiver: {where} -> {path or '(counted only)'}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        receiver.stop()
    return 0
