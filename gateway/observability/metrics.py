"""Prometheus metrics. Names start with `gateway_`; labels stay low-cardinality."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from gateway.admission import AdmissionController

REGISTRY = CollectorRegistry(auto_describe=True)

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
)
RATELIMIT_FALLBACK_DECISIONS = Counter(
    "gateway_ratelimit_fallback_decisions_total",
    "Decisions made without Redis, by failure mode (local, open, closed).",
    ["mode"],
    registry=REGISTRY,
)
REQUESTS = Counter(
    "gateway_requests_total",
    "Completion requests answered, by requested model and HTTP status.",
    ["model", "status"],
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
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
CONFIG_RELOADS = Counter(
    "gateway_config_reloads_total",
    "Tenant config reloads, by result (applied, rejected, unchanged).",
    ["result"],
    registry=REGISTRY,
)


def render() -> bytes:
    """The text exposition of every gateway metric."""
    return generate_latest(REGISTRY)


class AdmissionCollector(Collector):
    """Queue depth and requests in flight per model, read from the controller at scrape."""

    def __init__(self, admission: AdmissionController, models: Sequence[str]) -> None:
        self._admission = admission
        self._models = list(models)

    def collect(self) -> Iterator[Metric]:
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


_admission_collector: AdmissionCollector | None = None


def watch_admission(admission: AdmissionController, models: Sequence[str]) -> None:
    """Report this controller's queues (replacing a previous app's, in the same process)."""
    global _admission_collector
    if _admission_collector is not None:
        REGISTRY.unregister(_admission_collector)
    _admission_collector = AdmissionCollector(admission, models)
    REGISTRY.register(_admission_collector)
