"""Prometheus metrics. Names start with `gateway_`; labels stay low-cardinality."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

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
CONFIG_RELOADS = Counter(
    "gateway_config_reloads_total",
    "Tenant config reloads, by result (applied, rejected, unchanged).",
    ["result"],
    registry=REGISTRY,
)


def render() -> bytes:
    """The text exposition of every gateway metric."""
    return generate_latest(REGISTRY)
