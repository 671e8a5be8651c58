"""Read a Triton replica's own queue from its Prometheus endpoint."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import BackendKind

PENDING = "nv_inference_pending_request_count"


def default_metrics_url(kind: BackendKind, url: str) -> str | None:
    """Triton's metrics URL by its default port layout: HTTP P, gRPC P+1, metrics P+2."""
    if kind is BackendKind.OPENAI:
        return None
    parts = urlsplit(url if "://" in url else f"grpc://{url}")
    if parts.hostname is None or parts.port is None:
        return None
    offset = 2 if kind is BackendKind.TRITON_HTTP else 1
    return urlunsplit(("http", f"{parts.hostname}:{parts.port + offset}", "/metrics", "", ""))


async def pending_requests(
    session: aiohttp.ClientSession, metrics_url: str, model: str, timeout_s: float
) -> int | None:
    """`nv_inference_pending_request_count` of `model` (all versions), or None if unknown."""
    try:
        async with session.get(metrics_url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            if r.status != 200:
                return None
            text = await r.text()
    except (TimeoutError, aiohttp.ClientError, OSError):
        return None
    total: float | None = None
    for family in text_string_to_metric_families(text):
        if family.name != PENDING:
            continue
        for sample in family.samples:
            if sample.labels.get("model") == model:
                total = (total or 0.0) + sample.value
    return None if total is None else int(total)
