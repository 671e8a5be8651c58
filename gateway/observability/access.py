"""One record per completion request: the metrics it feeds and its structured log line."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gateway.observability import metrics
from gateway.observability.logging import SCRUBBED, redact
from gateway.observability.tracing import Attribute, RequestTrace

log = logging.getLogger("gateway.access")


# Tenant or model of a request not known (yet): no key, an unknown model, a bad body.
UNKNOWN = "-"
# The most of a logged prompt (`server.log_prompts`) a trace's span keeps.
TRACED_PROMPT_CHARS = 8192


# Told of a request once it is finished, with its duration in seconds: the usage ledger,
# when one is configured (`gateway.serving.usage`), handed to each record as it is made
# (`RequestRecord.sink`). It must not block.
UsageSink = Callable[["RequestRecord", float], None]


@dataclass(slots=True)
class RequestRecord:
    """What happened to one request; filled in along the path, emitted once at the end.

    Made as the request arrives, so that every request is counted and logged, however it
    ends. `tenant` and `model` are metric labels: only configured names go there (never
    what a client sent), `UNKNOWN` until known.
    """

    request_id: str
    tenant: str = UNKNOWN
    model: str = UNKNOWN
    # The name the client sent, when it was an alias of `model` (a coding tool's own
    # model name, say), cut short: the client chooses its length. Logged, never a label.
    alias: str = ""
    # The API it came by (`gateway.api.wire.Wire.name`).
    endpoint: str = "chat"
    stream: bool = False
    priority: str = ""
    served_model: str = ""
    status: int = 0
    # Why the gateway refused it (rate_requests, queue_full, ...); empty when it did not.
    reason: str = ""
    # Time spent in `queue_model`'s admission queue; None if the request never queued.
    queue_wait_s: float | None = None
    queue_model: str = ""
    ttft_s: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    fallbacks: list[str] = field(default_factory=list)
    # Answered with the stored answer of an Idempotency-Key: the request id of the run
    # that made it (which the client is told as its `x-request-id`).
    replay_of: str = ""
    # The prompt, only with `server.log_prompts` on (redacted like every log line).
    prompt: str | None = None
    # Which of the tenant's keys (`serving.auth.Identity.key_id`), and the prompt tokens
    # the replica's prefix cache held: for the usage ledger.
    key_id: str = ""
    cached_tokens: int = 0
    # The batch it was a line of (the Batch APIs), for the usage ledger; "" for none.
    batch_id: str = ""
    # An MCP tool call's arguments sent and result got back, in bytes (the ledger's).
    bytes_in: int = 0
    bytes_out: int = 0
    # How an MCP tool call ended (ok, tool_error, refused, timeout, ...): its HTTP status
    # is 200 whatever the call did (a JSON-RPC error is an answer).
    outcome: str = ""
    # What it cost in micro-units, each part priced by the model that served it (the
    # figure charged to its budgets), once the conductor settled it; None: not settled.
    cost_micros: int | None = None
    # Where the finished record goes next (`UsageSink`: the ledger; None: nowhere).
    sink: UsageSink | None = None
    # Its trace, when tracing is on and the sampler chose it (`observability.tracing`).
    trace: RequestTrace | None = None
    # The largest completion asked for, and why each answer ended: for the trace.
    max_tokens: int = 0
    finish_reasons: tuple[str, ...] = ()
    started: float = field(default_factory=time.perf_counter)
    _done: bool = False

    def finish(self, status: int, reason: str | None = None) -> None:
        """Count the request in the metrics and log it; later calls do nothing."""
        if self._done:
            return
        self._done = True
        self.status = status
        self.reason = reason or ""
        duration = time.perf_counter() - self.started
        served = self.served_model or "-"
        requests = metrics.REQUESTS
        metrics.labels(requests, self.tenant, self.model, served, str(status), self.endpoint).inc()
        stream = "true" if self.stream else "false"
        trace = self.trace
        # A traced request's times are the latency histograms' exemplars: a slow bucket
        # on the dashboard leads to a trace.
        trace_id = None if trace is None else trace.trace_id
        metrics.observe(metrics.DURATION, (self.model, stream), duration, trace_id)
        if self.reason:
            metrics.REFUSALS.labels(self.tenant, self.model, self.reason).inc()
        if self.served_model:
            tokens = metrics.TOKENS
            metrics.labels(tokens, self.tenant, self.served_model, "prompt").inc(self.prompt_tokens)
            completion = metrics.labels(tokens, self.tenant, self.served_model, "completion")
            completion.inc(self.completion_tokens)
        if self.queue_wait_s is not None:
            # Every request that was queued: served, shed, or still queued at its deadline.
            model = self.queue_model or self.served_model or self.model
            queued = (model, self.priority)
            metrics.observe(metrics.QUEUE_WAIT, queued, self.queue_wait_s, trace_id)
        # `server.log_prompts` only: redacted once, for the log line and the trace alike.
        prompt = None if self.prompt is None else redact(self.prompt)
        if log.isEnabledFor(logging.INFO):
            fields = {
                "request_id": self.request_id,
                "endpoint": self.endpoint,
                "tenant": self.tenant,
                # Which key: a managed key's id, or a file key's hash prefix (no secret).
                "key_id": self.key_id or None,
                "model": self.model,
                # The two values a client chooses, redacted here; the rest are the
                # gateway's own (configured names, ids, numbers), which `scrubbed` tells
                # the formatter not to scan again: a scan per line cost 5 us a request.
                "requested_model": redact(self.alias) if self.alias else None,
                "served_model": self.served_model or None,
                "stream": self.stream,
                "priority": self.priority,
                "status": status,
                "reason": self.reason or None,
                "fallbacks": self.fallbacks or None,
                "replay_of": self.replay_of or None,
                "queue_wait_ms": _ms(self.queue_wait_s),
                "ttft_ms": _ms(self.ttft_s),
                "duration_ms": _ms(duration),
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
            }
            if trace is not None:
                fields["trace_id"], fields["span_id"] = trace.trace_id, trace.span_id
            if prompt is not None:
                fields["prompt"] = prompt
            if self.outcome:
                fields["outcome"] = self.outcome
            log.handle(_access_line(fields))
        if trace is not None:
            self._end_trace(trace, status, duration, prompt)
        if self.sink is not None:
            self.sink(self, duration)

    def _end_trace(
        self, trace: RequestTrace, status: int, duration: float, prompt: str | None
    ) -> None:
        """The server span's last attributes (the GenAI conventions' and the gateway's
        own; `prompt`, redacted, with `server.log_prompts`), and its end."""
        model = self.model if self.model != UNKNOWN else ""
        attributes: dict[str, Attribute] = {
            "gen_ai.operation.name": trace.operation,
            "gen_ai.request.model": model,
            "gen_ai.response.id": self.request_id,
            "gen_ai.usage.input_tokens": self.prompt_tokens,
            "gen_ai.usage.output_tokens": self.completion_tokens,
            "http.response.status_code": status,
            "gateway.request_id": self.request_id,
            "gateway.endpoint": self.endpoint,
            "gateway.tenant": self.tenant,
            "gateway.stream": self.stream,
            "gateway.outcome": self.outcome
            or self.reason
            or ("ok" if status < 400 else str(status)),
            "gateway.duration_ms": _millis(duration),
        }
        if self.key_id:
            attributes["gateway.key_id"] = self.key_id
        if self.priority:
            attributes["gateway.priority"] = self.priority
        if self.served_model:
            attributes["gen_ai.response.model"] = self.served_model
        if self.max_tokens:
            attributes["gen_ai.request.max_tokens"] = self.max_tokens
        if self.finish_reasons:
            attributes["gen_ai.response.finish_reasons"] = self.finish_reasons
        if self.fallbacks:
            attributes["gateway.fallbacks"] = self.fallbacks
        if self.queue_wait_s is not None:
            attributes["gateway.queue_wait_ms"] = _millis(self.queue_wait_s)
        if self.ttft_s is not None:
            attributes["gateway.ttft_ms"] = _millis(self.ttft_s)
        if self.replay_of:
            attributes["gateway.replay_of"] = self.replay_of
        if self.cost_micros is not None:
            attributes["gateway.cost_micros"] = self.cost_micros
        if prompt is not None:
            # Cut: a span waits in the export queue, and a client chooses its prompt's size.
            attributes["gateway.prompt"] = prompt[:TRACED_PROMPT_CHARS]
        name = f"{trace.operation} {model}" if model else trace.operation
        # A server span is an error for the gateway's failures only, not a client's.
        error = (self.reason or str(status)) if status >= 500 else None
        trace.end(name, attributes, error)


# Every access line's attributes but its time and fields, made once: a LogRecord made
# by `log.info` (its caller's frame, its file's name, the `extra` copied in) cost more
# than formatting and writing the line. Handlers and formatters see a whole record.
_LINE = logging.LogRecord(log.name, logging.INFO, "(unknown file)", 0, "request", None, None)
_LINE_ATTRIBUTES = {**_LINE.__dict__, SCRUBBED: True}
# When logging started, which `relativeCreated` counts from.
_LOGGING_STARTED = _LINE.created - _LINE.relativeCreated / 1000


def _access_line(fields: Mapping[str, object]) -> logging.LogRecord:
    """The access line's record (`log.info("request", extra=...)`, made for less)."""
    record = logging.LogRecord.__new__(logging.LogRecord)
    attributes = record.__dict__
    attributes.update(_LINE_ATTRIBUTES)
    now = time.time()
    attributes["created"] = now
    attributes["msecs"] = (now - int(now)) * 1000
    attributes["relativeCreated"] = (now - _LOGGING_STARTED) * 1000
    attributes["fields"] = fields
    return record


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else _millis(seconds)


def _millis(seconds: float) -> float:
    return round(seconds * 1000, 2)
