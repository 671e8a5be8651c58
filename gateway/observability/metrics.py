"""Prometheus metrics. Names start with `gateway_`; labels stay low-cardinality.

With several worker processes (`gateway serve --workers N`), prometheus-client's
multiprocess mode: each worker writes its samples to memory-mapped files in
`PROMETHEUS_MULTIPROC_DIR`, and `/metrics` of whichever worker answers adds them up.
Counters and histograms sum over all workers, dead ones included; gauges use `live*`
modes, whose files are removed when their worker has exited (see `forget_dead_workers`).
"""

from __future__ import annotations

import contextlib
import glob
import os
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
    multiprocess,
    values,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.registry import Collector

from gateway.observability import exemplars

# prometheus-client's multiprocess mode: each worker writes its samples here.
MULTIPROCESS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"

# No `_created` series: no alert or panel reads them, and they double the counters' series.
disable_created_metrics()  # type: ignore[no-untyped-call]
REGISTRY = CollectorRegistry(auto_describe=True)

MetricT = TypeVar("MetricT", bound=MetricWrapperBase)
_children: dict[tuple[Any, tuple[str, ...]], Any] = {}


def labels(metric: MetricT, *values: str) -> MetricT:
    """`metric.labels(*values)`, remembered.

    For the request path: prometheus-client validates the values and takes a lock on
    every `labels()` call (about 2 us). The values given here come from the config
    (tenants, models, replicas, statuses), so the number of children stays bounded.
    """
    key = (metric, values)
    child = _children.get(key)
    if child is None:
        child = _children[key] = metric.labels(*values)
    return child


def observe(
    metric: Histogram, values: tuple[str, ...], amount: float, trace_id: str | None
) -> None:
    """`amount` into latency histogram `metric` (its labels `values`), with the trace id
    of a traced request as the bucket's exemplar, in every worker mode."""
    child = labels(metric, *values)
    if trace_id is None:
        child.observe(amount)
        return
    child.observe(amount, {"trace_id": trace_id})
    if _multiprocess():  # where prometheus-client drops it: this worker's file keeps it
        global _worker_exemplars
        if _worker_exemplars is None:
            _worker_exemplars = exemplars.WorkerExemplars(os.environ[MULTIPROCESS_DIR_ENV])
        family, names, bounds = _WITH_EXEMPLARS[metric]
        given = dict(zip(names, values, strict=True))
        _worker_exemplars.note(family, given, bounds, amount, trace_id)


RATELIMIT_DECISIONS = Counter(
    "gateway_ratelimit_decisions_total",
    "Rate-limit decisions, by tenant and result.",
    ["tenant", "result"],
    registry=REGISTRY,
)
RATELIMIT_BACKEND_UP = Gauge(
    "gateway_ratelimit_redis_up",
    "1 while the rate limiter reaches Redis, 0 while it runs on its failure mode.",
    registry=REGISTRY,
    # Across worker processes: 0 if any running worker is in its failure mode.
    multiprocess_mode="livemin",
)
RATELIMIT_FALLBACK_DECISIONS = Counter(
    "gateway_ratelimit_fallback_decisions_total",
    "Decisions made without Redis, by failure mode (local, open, closed).",
    ["mode"],
    registry=REGISTRY,
)
REQUESTS = Counter(
    "gateway_requests_total",
    "Requests answered, by tenant, requested model, serving model, status and endpoint "
    "(chat, completions, embeddings, messages, responses).",
    ["tenant", "model", "served_model", "status", "endpoint"],
    registry=REGISTRY,
)
REFUSALS = Counter(
    "gateway_refusals_total",
    "Requests refused, by tenant, model and reason (rate_requests, rate_tokens, "
    "concurrency, budget, limiter_unavailable, queue_full, shed, deadline, no_replica, "
    "model_starting, stored_responses_quota).",
    ["tenant", "model", "reason"],
    registry=REGISTRY,
)
FALLBACKS = Counter(
    "gateway_fallbacks_total",
    "Requests moved to a fallback model, by source, target and reason.",
    ["source", "target", "reason"],
    registry=REGISTRY,
)
# 2 and 30 are the default objectives of the online and batch classes.
_QUEUE_WAIT_BUCKETS = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 2.5, 5, 10, 30, 60, 120,
)  # fmt: skip
_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30)
_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
QUEUE_WAIT = Histogram(
    "gateway_queue_wait_seconds",
    "Time a request waited in a model's admission queue, by serving model and priority.",
    ["model", "priority"],
    buckets=_QUEUE_WAIT_BUCKETS,
    registry=REGISTRY,
)
TTFT = Histogram(
    "gateway_time_to_first_token_seconds",
    "Time from dispatch to the first streamed token, by serving model.",
    ["model"],
    buckets=_TTFT_BUCKETS,
    registry=REGISTRY,
)
DURATION = Histogram(
    "gateway_request_duration_seconds",
    "Time from arrival to the last byte of the answer, by requested model and streaming.",
    ["model", "stream"],
    buckets=_DURATION_BUCKETS,
    registry=REGISTRY,
)
# The latency histograms that carry exemplars (a traced request's trace id): their
# label names and bucket bounds, for the workers' exemplar files (`exemplars`).
_INF = float("inf")
_WITH_EXEMPLARS: dict[Histogram, tuple[str, tuple[str, ...], tuple[float, ...]]] = {
    QUEUE_WAIT: ("gateway_queue_wait_seconds", ("model", "priority"), (*_QUEUE_WAIT_BUCKETS, _INF)),
    TTFT: ("gateway_time_to_first_token_seconds", ("model",), (*_TTFT_BUCKETS, _INF)),
    DURATION: ("gateway_request_duration_seconds", ("model", "stream"), (*_DURATION_BUCKETS, _INF)),
}
_worker_exemplars: exemplars.WorkerExemplars | None = None


TOKENS = Counter(
    "gateway_tokens_total",
    "Tokens served, by tenant, serving model and kind (prompt, completion).",
    ["tenant", "model", "kind"],
    registry=REGISTRY,
)
REPLICAS_UNPLACED = Gauge(
    "gateway_replicas_unplaced",
    "Replicas of a cluster.yaml deployment that fit on no node up (0 when all are placed).",
    ["model"],
    registry=REGISTRY,
    multiprocess_mode="livemax",
)
MODEL_REPLICAS = Gauge(
    "gateway_model_replicas",
    "Replicas of an autoscaled model: desired (the closed loop's decision) and ready "
    "(loaded and taking requests; on Kubernetes, the pods its Deployment runs).",
    ["model", "state"],
    registry=REGISTRY,
    multiprocess_mode="livemax",
)
SCALE_UP_SECONDS = Histogram(
    "gateway_scale_up_seconds",
    "From the closed loop's decision to add replicas of a model to their being ready.",
    ["model"],
    buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600),
    registry=REGISTRY,
)
SCALE_EVENTS = Counter(
    "gateway_scale_events_total",
    "The closed loop's changes of a model's desired replicas, by direction and reason.",
    ["model", "direction", "reason"],
    registry=REGISTRY,
)
CONNECTIONS_CLOSED = Counter(
    "gateway_connections_closed_total",
    "Client connections the gateway closed or refused before a request was served, by "
    "reason (head_timeout, body_timeout, head_too_large, too_many_connections, "
    "too_many_from_address, too_many_slow_from_address, bad_proxy_header).",
    ["reason"],
    registry=REGISTRY,
)
OUTBOUND_FINDINGS = Counter(
    "gateway_outbound_findings_total",
    "Sensitive data found in requests to external models, by model, category (api_key, "
    "token, password, private_key, jwt, email, phone, card, iban, host) and the policy "
    "applied (mask, block).",
    ["model", "category", "policy"],
    registry=REGISTRY,
)
REPLICA_REQUESTS = Counter(
    "gateway_replica_requests_total",
    "Requests a replica answered (streams counted when they end).",
    ["model", "replica"],
    registry=REGISTRY,
)
REPLICA_TOKENS = Counter(
    "gateway_replica_tokens_total",
    "Completion tokens a replica generated: its effective throughput is the rate.",
    ["model", "replica"],
    registry=REGISTRY,
)
REPLICA_PROMPT_TOKENS = Counter(
    "gateway_replica_prompt_tokens_total",
    "Prompt tokens a replica computed or found cached, as replicas that report their "
    "prefix cache count them.",
    ["model", "replica"],
    registry=REGISTRY,
)
REPLICA_CACHED_TOKENS = Counter(
    "gateway_replica_cached_prompt_tokens_total",
    "Prompt tokens a replica's prefix cache held (not computed again): over "
    "gateway_replica_prompt_tokens_total, the cached fraction.",
    ["model", "replica"],
    registry=REGISTRY,
)
ROUTING_SKIPS = Counter(
    "gateway_routing_preferred_skipped_total",
    "Requests of cache-aware routing not sent to their preferred replica (the owner of "
    "their session or prefix), by reason: load (above the load bound or its in-flight "
    "cap) or unavailable (unhealthy or ejected).",
    ["model", "reason"],
    registry=REGISTRY,
)
REPLICA_EJECTIONS = Counter(
    "gateway_replica_ejections_total",
    "Times a replica was ejected by the passive outlier check.",
    ["model", "replica"],
    registry=REGISTRY,
)
RETRIES = Counter(
    "gateway_retries_total",
    "Requests sent again to another replica after a transient failure.",
    ["model"],
    registry=REGISTRY,
)
RETRY_BUDGET_EXHAUSTED = Counter(
    "gateway_retry_budget_exhausted_total",
    "Retries not made because the model's retry budget was spent.",
    ["model"],
    registry=REGISTRY,
)
STREAMS_CUT = Counter(
    "gateway_streams_cut_total",
    "Streams ended early by the client: it left (client_gone) or stopped reading (client_stalled).",
    ["model", "reason"],
    registry=REGISTRY,
)
BATCHES_CREATED = Counter(
    "gateway_batches_created_total",
    "Batches made through the Batch APIs (gateway/batches/), by API (openai, anthropic).",
    ["api"],
    registry=REGISTRY,
)
BATCHES = Gauge(
    "gateway_batches",
    "Batches in the batch database by status (in_progress, finalizing, completed, ...), "
    "as the last housekeeping of any gateway process counted them.",
    ["status"],
    registry=REGISTRY,
    # Every process counts the same database: the newest count, not their sum.
    multiprocess_mode="livemax",
)
BATCH_LINES = Counter(
    "gateway_batch_lines_total",
    "Batch lines this gateway ran to an end, by outcome: done (2xx), failed (an error, "
    "or stopped by a spent budget), retried (given back to wait for a limit or a slot).",
    ["outcome"],
    registry=REGISTRY,
)
BATCH_TOKENS = Counter(
    "gateway_batch_tokens_total",
    "Tokens of the batch lines this gateway answered, by kind (input, output).",
    ["kind"],
    registry=REGISTRY,
)
MCP_CALLS = Counter(
    "gateway_mcp_calls_total",
    "MCP tool calls through the gateway, by upstream server, tool and outcome (ok, "
    "tool_error, refused, rate_limited, blocked, timeout, too_large, unavailable, error, "
    "malformed).",
    ["server", "tool", "outcome"],
    registry=REGISTRY,
)
MCP_CALL_SECONDS = Histogram(
    "gateway_mcp_call_duration_seconds",
    "How long an MCP tool call took at the gateway, from its arrival to its answer.",
    ["server"],
    buckets=_DURATION_BUCKETS,
    registry=REGISTRY,
)
MCP_TOOLS_HELD = Counter(
    "gateway_mcp_tools_held_total",
    "MCP tools held from clients (or flagged, with on_tool_change: flag): a description "
    "or schema changed since first listed, or one that reads as instructions.",
    ["server"],
    registry=REGISTRY,
)
MCP_SESSIONS_STARTED = Counter(
    "gateway_mcp_sessions_started_total",
    "MCP client sessions begun (the initialize handshake) on this gateway.",
    registry=REGISTRY,
)
ONLINE_DELAYED_BY_BATCH = Counter(
    "gateway_online_delayed_by_batch_total",
    "Requests of an online class that waited in a model's queue while a batch line took "
    "a slot after they had queued: 0 by construction (admission grants by class).",
    ["model"],
    registry=REGISTRY,
)
TRACE_SPANS_EXPORTED = Counter(
    "gateway_trace_spans_exported_total",
    "Spans the OTLP collector took (gateway/observability/tracing.py).",
    registry=REGISTRY,
)
TRACE_SPANS_DROPPED = Counter(
    "gateway_trace_spans_dropped_total",
    "Spans not exported: the export queue was full (queue_full), or the collector failed "
    "or did not answer in time (export_failed).",
    ["reason"],
    registry=REGISTRY,
)
REDIS_DURATION = Histogram(
    "gateway_redis_duration_seconds",
    "Time of one round trip of the rate limiter to Redis (the script calls of one moment).",
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5),
    registry=REGISTRY,
)
REDIS_CALLS_PER_ROUND_TRIP = Histogram(
    "gateway_redis_calls_per_round_trip",
    "Script calls (admissions, charges, settles) sent together in one round trip to Redis.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
    registry=REGISTRY,
)
REDIS_ERRORS = Counter(
    "gateway_redis_errors_total",
    "Redis calls that failed, by operation.",
    ["operation"],
    registry=REGISTRY,
)
CONFIG_INFO = Gauge(
    "gateway_config_info",
    "1 for the version (digest of gateway.yaml and the tenants file) that is loaded.",
    ["version"],
    registry=REGISTRY,
    # Across worker processes: 1 for each version some running worker has loaded.
    multiprocess_mode="livemax",
)
DISCOVERY_LOOKUPS = Counter(
    "gateway_discovery_lookups_total",
    "DNS lookups of models' replicas (models.*.discovery), by model and result (ok, failed).",
    ["model", "result"],
    registry=REGISTRY,
)
CONFIG_RELOADS = Counter(
    "gateway_config_reloads_total",
    "Tenant config reloads, by result (applied, rejected, unchanged).",
    ["result"],
    registry=REGISTRY,
)


BUDGET_USED = Gauge(
    "gateway_budget_used_ratio",
    "Share of a spend budget used in its current period (1: spent), as of the last "
    "request under it, by tenant, key id (empty: the tenant's own), period and model "
    "(empty: every model).",
    ["tenant", "key", "period", "model"],
    registry=REGISTRY,
    multiprocess_mode="livemax",
)
BUDGET_SOFT = Gauge(
    "gateway_budget_soft_ratio",
    "A spend budget's soft threshold (a share of it): its alert fires past it.",
    ["tenant", "key", "period", "model"],
    registry=REGISTRY,
    multiprocess_mode="livemax",
)
SPEND = Counter(
    "gateway_spend_micros_total",
    "What requests cost, in micro-units of the price table's currency (each part priced "
    "by the model that served it), by tenant and the model the request named.",
    ["tenant", "model"],
    registry=REGISTRY,
)


def budget_used(scope: tuple[str, ...], capacity: float, remaining: float, soft: float) -> None:
    """A budget's use as Redis reported it on a request (`scope`: its labels)."""
    labels(BUDGET_USED, *scope).set(min(1.0, max(0.0, 1 - remaining / capacity)))
    labels(BUDGET_SOFT, *scope).set(soft)


STORED_RESPONSES_BYTES = Gauge(
    "gateway_stored_responses_bytes",
    "Bytes a tenant's stored Responses API answers hold in Redis (as counted against "
    "its quota, `stored_responses.max_bytes`), as of the last store or check of one.",
    ["tenant"],
    registry=REGISTRY,
    multiprocess_mode="livemax",
)
STORED_RESPONSES_COUNT = Gauge(
    "gateway_stored_responses",
    "A tenant's stored Responses API answers in Redis, as of the last store or check.",
    ["tenant"],
    registry=REGISTRY,
    multiprocess_mode="livemax",
)
STORED_RESPONSES_QUOTA = Gauge(
    "gateway_stored_responses_quota",
    "A tenant's quota on stored responses, by unit (bytes, responses).",
    ["tenant", "unit"],
    registry=REGISTRY,
    multiprocess_mode="livemax",
)
STORED_RESPONSES_REFUSED = Counter(
    "gateway_stored_responses_refused_total",
    "Answers not stored because their tenant's stored responses had no room left for "
    "them, by the quota reached (max_bytes, max_count); each was still answered. (A "
    "request refused before it ran counts in gateway_refusals_total, reason "
    "stored_responses_quota.)",
    ["tenant", "quota"],
    registry=REGISTRY,
)


class _StoreFigures(Protocol):
    @property
    def bytes(self) -> int: ...

    @property
    def count(self) -> int: ...


class _StoreLimits(Protocol):
    @property
    def max_bytes(self) -> int: ...

    @property
    def max_count(self) -> int: ...


def stored_responses(
    tenant: str, usage: _StoreFigures, limits: _StoreLimits, refused: str | None = None
) -> None:
    """A tenant's stored responses as Redis counted them, its quota, and an answer not
    stored for want of room (`refused`: the quota reached)."""
    labels(STORED_RESPONSES_BYTES, tenant).set(usage.bytes)
    labels(STORED_RESPONSES_COUNT, tenant).set(usage.count)
    labels(STORED_RESPONSES_QUOTA, tenant, "bytes").set(limits.max_bytes)
    labels(STORED_RESPONSES_QUOTA, tenant, "responses").set(limits.max_count)
    if refused is not None:
        labels(STORED_RESPONSES_REFUSED, tenant, refused).inc()


LEDGER_RECORDS = Gauge(
    "gateway_ledger_records",
    "Usage records not yet in the ledger's database, by where they wait (memory, spool).",
    ["where"],
    registry=REGISTRY,
    multiprocess_mode="livesum",
)
LEDGER_LAG = Gauge(
    "gateway_ledger_lag_seconds",
    "Age of the oldest usage record not yet in the ledger's database (0: none waits).",
    registry=REGISTRY,
    multiprocess_mode="livemax",
)
LEDGER_WRITTEN = Counter(
    "gateway_ledger_records_written_total",
    "Usage records written to the ledger's database.",
    registry=REGISTRY,
)
LEDGER_DROPPED = Counter(
    "gateway_ledger_records_dropped_total",
    "Usage records lost (spool full or unwritable, memory full): each is also logged.",
    registry=REGISTRY,
)


def observe_ledger(
    buffered: int, spooled: int, lag_s: float, new_written: int, new_dropped: int
) -> None:
    """The usage ledger's state: records waiting, the oldest one's age, and the records
    written and lost since the last report."""
    LEDGER_RECORDS.labels("memory").set(buffered)
    LEDGER_RECORDS.labels("spool").set(spooled)
    LEDGER_LAG.set(lag_s)
    if new_written > 0:
        LEDGER_WRITTEN.inc(new_written)
    if new_dropped > 0:
        LEDGER_DROPPED.inc(new_dropped)


# Series that alerts watch for increases exist from the start at 0, so their first
# increment counts as one.
for _result in ("applied", "rejected", "unchanged"):
    CONFIG_RELOADS.labels(_result)

_loaded_version: str | None = None


def set_config_version(version: str) -> None:
    """Report `version` as the loaded config (1) and the one before it as gone (0)."""
    global _loaded_version
    if _loaded_version is not None and _loaded_version != version:
        # Set to 0 rather than removed: worker processes' samples live in files.
        CONFIG_INFO.labels(_loaded_version).set(0)
    CONFIG_INFO.labels(version).set(1)
    _loaded_version = version


# -- state: admission queues and replicas ------------------------------------------------


@dataclass(frozen=True, slots=True)
class StateMetric:
    """A value read from the running gateway's state rather than counted per request."""

    # As on the `# TYPE` line: a counter's samples add `_total`.
    name: str
    help: str
    labels: tuple[str, ...]
    # How `/metrics` combines worker processes' values (prometheus-client's
    # multiprocess mode): the workers' own queues add up; replica state and Triton's
    # numbers, which every worker reads for itself, take the highest.
    mode: Literal["livesum", "livemax"]
    # Re-exported from Triton, where it is a counter.
    counter: bool = False

    @property
    def sample_name(self) -> str:
        return f"{self.name}_total" if self.counter else self.name


ADMISSION_IN_FLIGHT = StateMetric(
    "gateway_admission_in_flight", "Requests upstream, by model.", ("model",), "livesum"
)
ADMISSION_QUEUED = StateMetric(
    "gateway_admission_queued",
    "Requests waiting in the admission queue, by model and priority.",
    ("model", "priority"),
    "livesum",
)
REPLICA_HEALTHY = StateMetric(
    "gateway_replica_healthy",
    "1 while a replica passes its active health check.",
    ("model", "replica"),
    # 1 while any worker's check passes: 0 means every worker fails to reach it.
    "livemax",
)
REPLICA_EJECTED = StateMetric(
    "gateway_replica_ejected",
    "1 while a replica is ejected by the passive outlier check.",
    ("model", "replica"),
    # 1 while any worker has ejected it.
    "livemax",
)
REPLICA_IN_FLIGHT = StateMetric(
    "gateway_replica_in_flight",
    "The gateway's requests in flight on a replica: their spread across a model's "
    "replicas is the load spread.",
    ("model", "replica"),
    "livesum",
)
TRITON_PENDING = StateMetric(
    "gateway_triton_pending_requests",
    "Requests queued in Triton on a replica (all clients), scraped from its metrics.",
    ("model", "replica"),
    "livemax",
)
TRITON_QUEUE_TIME = StateMetric(
    "gateway_triton_queue_duration_seconds",
    "Time requests spent queued in Triton on a replica, scraped from its metrics.",
    ("model", "replica"),
    # The freshest worker's reading: the highest, as the counter only grows.
    "livemax",
    counter=True,
)
STATE_METRICS = (
    ADMISSION_IN_FLIGHT,
    ADMISSION_QUEUED,
    REPLICA_HEALTHY,
    REPLICA_EJECTED,
    REPLICA_IN_FLIGHT,
    TRITON_PENDING,
    TRITON_QUEUE_TIME,
)
# Multiprocess mode: each worker writes its state here (in no registry: `render` reads
# the files). The Triton counter is written as a gauge and typed back in `render`.
_WORKER_GAUGES = {
    m.name: Gauge(m.sample_name, m.help, m.labels, registry=None, multiprocess_mode=m.mode)
    for m in STATE_METRICS
}
# Series per replica: in multiprocess mode, only those of the current replicas show.
_REPLICA_SERIES = {m.sample_name for m in STATE_METRICS if "replica" in m.labels}


StateSample = tuple[StateMetric, list[str], float]


class StateSource(Protocol):
    """What a running gateway tells about its queues and replicas; the app wires one in
    (`gateway.serving.gateway_state`), so this module needs to know nothing of either."""

    def models(self) -> Collection[str]:
        """The models served now."""
        ...

    def samples(self, model: str) -> Iterator[StateSample]:
        """Every state sample of `model` now: (metric, label values, value)."""
        ...

    def replica_urls(self, model: str) -> Iterable[str]:
        """The URLs of `model`'s replicas now."""
        ...


class StateCollector(Collector):
    """Admission queues and replica state, read from the running gateway.

    One process: read at scrape time. Several: each worker writes its own values to its
    files after every health-check round of a model (`publish_state`) and the worker
    answering a scrape once more just before; `render` combines them.
    """

    def __init__(self, source: StateSource) -> None:
        self._source = source

    def values(self, model: str | None = None) -> Iterator[StateSample]:
        """Every state sample now, or `model`'s only."""
        models = self._source.models()
        for name in models if model is None else [model] if model in models else []:
            yield from self._source.samples(name)

    def collect(self) -> Iterator[Metric]:
        families: dict[StateMetric, GaugeMetricFamily | CounterMetricFamily] = {
            m: (CounterMetricFamily if m.counter else GaugeMetricFamily)(
                m.name, m.help, labels=m.labels
            )
            for m in STATE_METRICS
        }
        for metric, label_values, value in self.values():
            families[metric].add_metric(label_values, value)
        yield from families.values()

    def publish(self, model: str | None = None) -> None:
        """Write this process's values (`model`'s only, when given) to its metric files."""
        for metric, label_values, value in self.values(model):
            labels(_WORKER_GAUGES[metric.name], *label_values).set(value)

    def add_replicas(self, model: str) -> None:
        """Create `model`'s ejection series at 0, also for replicas placed later."""
        if model in self._source.models():
            for url in self._source.replica_urls(model):
                labels(REPLICA_EJECTIONS, model, url)

    def replicas(self) -> set[tuple[str, str]]:
        """(model, replica URL) of every replica served now."""
        source = self._source
        return {(model, url) for model in source.models() for url in source.replica_urls(model)}


_state_collector: StateCollector | None = None


def watch_state(source: StateSource) -> None:
    """Report this gateway's queues and replicas (replacing a previous app's, if any)."""
    global _state_collector
    if _state_collector is not None:
        REGISTRY.unregister(_state_collector)
    _state_collector = StateCollector(source)
    REGISTRY.register(_state_collector)
    for model in source.models():
        publish_state(model)


def publish_state(model: str) -> None:
    """After a health-check round of `model` (not per request): create its replicas'
    ejection series and, with several workers, write this worker's queue and replica
    state for `/metrics` of every worker."""
    state = _state_collector
    if state is None:
        return
    state.add_replicas(model)
    if _multiprocess():
        state.publish(model)


# -- exposition ----------------------------------------------------------------------------


def _multiprocess() -> bool:
    """Whether this process writes its samples to files (prometheus-client chooses so on
    import, from `PROMETHEUS_MULTIPROC_DIR`)."""
    return bool(getattr(values.ValueClass, "_multiprocess", False))


def render(openmetrics: bool = False) -> bytes:
    """The text exposition of every gateway metric: Prometheus's, or OpenMetrics (which
    alone carries the latency histograms' exemplars: the trace id of a request that fell
    in a bucket, when tracing is on).

    With several worker processes (`PROMETHEUS_MULTIPROC_DIR` set by `gateway serve
    --workers N`), whichever worker answers: counters and histograms summed over all
    workers, gauges combined over the running ones by their multiprocess mode; the
    workers' files keep no exemplars (a prometheus-client limit), so only one worker
    shows them.
    """
    generate = generate_openmetrics if openmetrics else generate_latest
    if not _multiprocess():
        return generate(REGISTRY)
    path = os.environ[MULTIPROCESS_DIR_ENV]
    state = _state_collector
    if state is not None:
        state.publish()  # this worker's own values, current
    forget_dead_workers(path)
    registry = CollectorRegistry()
    registry.register(_WorkersCollector(path, state.replicas() if state is not None else None))
    if openmetrics and _worker_exemplars is not None:
        _worker_exemplars.write()  # this worker's newest, current
    return generate(registry)


class _WorkersCollector(Collector):
    """The workers' files, added up by prometheus-client's `MultiProcessCollector`.

    Series per replica are kept for `replicas` only (a file keeps a replica a placement
    removed), and the Triton queue time, written as a gauge, is typed as a counter.
    """

    def __init__(self, path: str, replicas: set[tuple[str, str]] | None) -> None:
        self._path = path
        self._replicas = replicas

    def collect(self) -> Iterator[Metric]:
        files = multiprocess.MultiProcessCollector(None, self._path)  # type: ignore[no-untyped-call]
        family: Metric
        families: list[Metric] = []
        for family in files.collect():  # type: ignore[no-untyped-call]
            if self._replicas is not None and family.name in _REPLICA_SERIES:
                family.samples = [
                    s
                    for s in family.samples
                    if (s.labels.get("model"), s.labels.get("replica")) in self._replicas
                ]
            if family.name == TRITON_QUEUE_TIME.sample_name:
                counter = Metric(TRITON_QUEUE_TIME.name, family.documentation, "counter")
                counter.samples = family.samples
                family = counter
            families.append(family)
        yield from exemplars.attached(families, self._path)


def forget_dead_workers(path: str) -> list[int]:
    """Remove the live-gauge files of worker processes that have exited; their pids.

    prometheus-client's collector adds up every file in the directory: it does not
    know which processes still run, `live*` gauge modes only mark the files that
    `multiprocess.mark_process_dead(pid)` removes. uvicorn's supervisor, which sees a
    worker exit, offers no hook to call it, so the worker answering a scrape does it
    for all, before reading. Counter and histogram files stay: what a dead worker
    counted stays counted.
    """
    pids: set[int] = set()
    for pattern, suffix in (("gauge_live*_*.db", ".db"), ("exemplars_*.json", ".json")):
        for file in glob.glob(os.path.join(glob.escape(path), pattern)):
            name = os.path.basename(file).rsplit("_", 1)[1].removesuffix(suffix)
            if name.isdecimal():
                pids.add(int(name))
    dead = sorted(pid for pid in pids if not _running(pid))
    for pid in dead:
        # Another worker's scrape may remove them at the same time.
        with contextlib.suppress(FileNotFoundError):
            multiprocess.mark_process_dead(pid, path)  # type: ignore[no-untyped-call]
    exemplars.forget(path, dead)
    return dead


def _running(pid: int) -> bool:
    """Whether process `pid` exists and has not exited (a zombie has)."""
    if pid == os.getpid():
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            stat = file.read()
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return False
        try:  # no procfs (macOS): ask the kernel
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    except OSError:
        return True
    # "pid (command) state ...": the command may hold spaces and parentheses.
    fields = stat.rpartition(b")")[2].split()
    return not fields or fields[0] not in (b"Z", b"X")


def clear_multiprocess_dir(*, keep_own: bool) -> None:
    """Remove the `*.db` files earlier runs left in `PROMETHEUS_MULTIPROC_DIR` (at start).

    The collector adds up every file there, so an old run's counters and gauges would
    show, also in a directory the operator chose. Other files stay. `keep_own`: keep this
    process's files (metrics created on import, when the variable was set before), for
    a process that serves; a supervisor's, which never change, would show for good (its
    `gateway_ratelimit_redis_up` at 0). Nothing happens when the variable is unset.
    """
    path = os.environ.get(MULTIPROCESS_DIR_ENV)
    if not path:
        return
    os.makedirs(path, exist_ok=True)
    exemplars.clear(path)
    own = f"_{os.getpid()}.db"
    for file in glob.glob(os.path.join(glob.escape(path), "*.db")):
        if not (keep_own and file.endswith(own)):
            with contextlib.suppress(FileNotFoundError):
                os.remove(file)


def metric_families() -> dict[str, str]:
    """Name (as on the `# TYPE` line) and type of every gateway metric, state included."""
    families = {
        family.name: family.type
        for value in list(globals().values())
        if isinstance(value, MetricWrapperBase)
        for family in value.describe()
    }
    families.update({m.name: "counter" if m.counter else "gauge" for m in STATE_METRICS})
    return families


def observe_redis_round_trip(calls: int, seconds: float) -> None:
    """Count one round trip of the rate limiter to Redis carrying `calls` script calls."""
    REDIS_DURATION.observe(seconds)
    REDIS_CALLS_PER_ROUND_TRIP.observe(calls)
