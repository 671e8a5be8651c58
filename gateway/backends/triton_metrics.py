"""Read a Triton replica's own queue from its Prometheus endpoint."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import BackendKind

PENDING = "nv_inference_pending_request_count"
# Counters, although the exposition may call them untyped or append no suffix.
QUEUE_DURATION = "nv_inference_queue_duration_us"
REQUESTS = "nv_inference_request_success"


def default_metrics_url(kind: BackendKind, url: str) -> str | None:
    """Triton's metrics URL by its default port layout: HTTP P, gRPC P+1, metrics P+2."""
    if kind is BackendKind.OPENAI:
        return None
    parts = urlsplit(url if "://" in url else f"grpc://{url}")
    if parts.hostname is None or parts.port is None:
        return None
    offset = 2 if kind is BackendKind.TRITON_HTTP else 1
    return urlunsplit(("http", f"{parts.hostname}:{parts.port + offset}", "/metrics", "", ""))


@dataclass(frozen=True, slots=True)
class TritonQueue:
    """One model's queue on one Triton replica, as Triton reports it."""

    # Requests waiting in Triton's scheduler (0 for decoupled models while they stream).
    pending: int
    # Cumulative time requests spent queued in Triton, in seconds.
    queue_seconds: float
    # Requests Triton has completed, cumulative.
    requests: float = 0.0


def queue_delay(before: TritonQueue, now: TritonQueue) -> float | None:
    """The mean time a request spent queued in Triton between two scrapes, in seconds;
    None when no request completed in between (or a counter went back: a restart)."""
    served = now.requests - before.requests
    queued = now.queue_seconds - before.queue_seconds
    if served <= 0 or queued < 0:
        return None
    return queued / served


async def scrape_queue(
    session: aiohttp.ClientSession, metrics_url: str, model: str, timeout_s: float
) -> TritonQueue | None:
    """`model`'s queue from a replica's metrics endpoint (all versions), or None if unknown."""
    try:
        async with session.get(metrics_url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            if r.status != 200:
                return None
            text = await r.text()
    except (TimeoutError, aiohttp.ClientError, OSError):
        return None
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name in (PENDING, QUEUE_DURATION, REQUESTS):
            for sample in family.samples:
                if sample.labels.get("model") == model:
                    found[family.name] = found.get(family.name, 0.0) + sample.value
    if PENDING not in found:
        return None
    return TritonQueue(
        int(found[PENDING]), found.get(QUEUE_DURATION, 0.0) / 1e6, found.get(REQUESTS, 0.0)
    )
