"""Prometheus metrics. Names start with `gateway_`; labels stay low-cardinality."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from gateway.admission import AdmissionController
    from gateway.routes import ModelRoute

# prometheus-client's multiprocess mode: each worker writes its samples here.
MULTIPROCESS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"

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
    # Across worker processes: 0 if any worker is in its failure mode.
    multiprocess_mode="min",
)
RATELIMIT_FALLBACK_DECISIONS = Counter(
    "gateway_ratelimit_fallback_decisions_total",
    "Decisions made without Redis, by failure mode (local, open, closed).",
    ["mode"],
    registry=REGISTRY,
)
REQUESTS = Counter(
    "gateway_requests_total",
    "Completion requests answered, by tenant, requested model, serving model and status.",
    ["tenant", "model", "served_model", "status"],
    registry=REGISTRY,
)
REFUSALS = Counter(
    "gateway_refusals_total",
    "Requests refused, by tenant, model and reason (rate_requests, rate_tokens, "
    "concurrency, queue_full, shed, deadline, no_replica).",
    ["tenant", "model", "reason"],
    registry=REGISTRY,
)
FALLBACKS = Counter(
    "gateway_fallbacks_total",
    "Requests moved to a fallback model, by source, target and reason.",
    ["source", "target", "reason"],
    registry=REGISTRY,
)
QUEUE_WAIT = Histogram(
    "gateway_queue_wait_seconds",
    "Time a request waited in a model's admission queue, by serving model and priority.",
    ["model", "priority"],
    # 2 and 30 are the default objectives of the online and batch classes.
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 2.5, 5, 10, 30, 60, 120),
    registry=REGISTRY,
)
TTFT = Histogram(
    "gateway_time_to_first_token_seconds",
    "Time from dispatch to the first streamed token, by serving model.",
    ["model"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
    registry=REGISTRY,
)
DURATION = Histogram(
    "gateway_request_duration_seconds",
    "Time from arrival to the last byte of the answer, by requested model and streaming.",
    ["model", "stream"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
    registry=REGISTRY,
)
TOKENS = Counter(
    "gateway_tokens_total",
    "Tokens served, by tenant, serving model and kind (prompt, completion).",
    ["tenant", "model", "kind"],
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
    multiprocess_mode="max",
)
CONFIG_RELOADS = Counter(
    "gateway_config_reloads_total",
    "Tenant config reloads, by result (applied, rejected, unchanged).",
    ["result"],
    registry=REGISTRY,
)


def render() -> bytes:
    """The text exposition of every gateway metric.

    With several worker processes (`PROMETHEUS_MULTIPROC_DIR` set by `gateway serve
    --workers N`) counters and histograms are summed over all workers, whichever worker
    answers the scrape; the queue and replica gauges are that worker's own view.
    """
    if MULTIPROCESS_DIR_ENV not in os.environ:
        return generate_latest(REGISTRY)
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    if _state_collector is not None:
        registry.register(_state_collector)
    return generate_latest(registry)


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


class StateCollector(Collector):
    """Admission queues and replica state, read from the running gateway at scrape time."""

    def __init__(self, admission: AdmissionController, routes: Sequence[ModelRoute]) -> None:
        self._admission = admission
        self._routes = list(routes)
        self._models = [route.name for route in self._routes]

    def collect(self) -> Iterator[Metric]:
        yield from self._admission_metrics()
        yield from self._replica_metrics()

    def _replica_metrics(self) -> Iterator[Metric]:
        from gateway.resilience.outlier import ReplicaState

        healthy = GaugeMetricFamily(
            "gateway_replica_healthy",
            "1 while a replica passes its active health check.",
            labels=["model", "replica"],
        )
        ejected = GaugeMetricFamily(
            "gateway_replica_ejected",
            "1 while a replica is ejected by the passive outlier check.",
            labels=["model", "replica"],
        )
        pending = GaugeMetricFamily(
            "gateway_triton_pending_requests",
            "Requests queued in Triton on a replica (all clients), scraped from its metrics.",
            labels=["model", "replica"],
        )
        queue_time = CounterMetricFamily(
            "gateway_triton_queue_duration_seconds",
            "Time requests spent queued in Triton on a replica, scraped from its metrics.",
            labels=["model", "replica"],
        )
        for route in self._routes:
            for replica in route.pool.replicas:
                labels = [route.name, replica.url]
                healthy.add_metric(labels, 1 if replica.healthy else 0)
                state = route.resilience.outlier.state(replica)
                ejected.add_metric(labels, 1 if state is ReplicaState.EJECTED else 0)
                if replica.metrics_url is not None:
                    pending.add_metric(labels, replica.upstream_pending)
                    queue_time.add_metric(labels, replica.upstream_queue_seconds)
        yield healthy
        yield ejected
        yield pending
        yield queue_time

    def _admission_metrics(self) -> Iterator[Metric]:
        in_flight = GaugeMetricFamily(
            "gateway_admission_in_flight", "Requests upstream, by model.", labels=["model"]
        )
        queued = GaugeMetricFamily(
            "gateway_admission_queued",
            "Requests waiting in the admission queue, by model and priority.",
            labels=["model", "priority"],
        )
        for model in self._models:
            snapshot = self._admission.snapshot(model)
            in_flight.add_metric([model], snapshot.in_flight)
            for priority, count in snapshot.queued.items():
                queued.add_metric([model, priority], count)
        yield in_flight
        yield queued


_state_collector: StateCollector | None = None


def watch_state(admission: AdmissionController, routes: Sequence[ModelRoute]) -> None:
    """Report this gateway's queues and replicas (replacing a previous app's, if any)."""
    global _state_collector
    if _state_collector is not None:
        REGISTRY.unregister(_state_collector)
    _state_collector = StateCollector(admission, routes)
    REGISTRY.register(_state_collector)
    for route in routes:
        for replica in route.pool.replicas:
            REPLICA_EJECTIONS.labels(route.name, replica.url)


def observe_redis_round_trip(calls: int, seconds: float) -> None:
    """Count one round trip of the rate limiter to Redis carrying `calls` script calls."""
    REDIS_DURATION.observe(seconds)
    REDIS_CALLS_PER_ROUND_TRIP.observe(calls)
