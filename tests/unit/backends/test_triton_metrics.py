"""Triton's own metrics: where a replica's are, and its queue delay between scrapes."""

from __future__ import annotations

import pytest

from gateway.backends.triton_metrics import TritonQueue, queue_delay


def test_triton_metrics_url_follows_the_default_port_layout() -> None:
    from gateway.backends.triton_metrics import default_metrics_url
    from gateway.config import BackendKind

    http = default_metrics_url(BackendKind.TRITON_HTTP, "http://10.0.0.5:8000")
    assert http == "http://10.0.0.5:8002/metrics"
    grpc = default_metrics_url(BackendKind.TRITON_GRPC, "10.0.0.5:8001")
    assert grpc == "http://10.0.0.5:8002/metrics"
    assert default_metrics_url(BackendKind.OPENAI, "http://vllm:8000") is None


def test_queue_delay_is_the_mean_wait_of_the_requests_completed_between_scrapes() -> None:
    before = TritonQueue(pending=0, queue_seconds=10.0, requests=100)
    assert queue_delay(before, TritonQueue(0, 12.0, 140)) == pytest.approx(0.05)
    assert queue_delay(before, TritonQueue(0, 10.0, 100)) is None  # nothing completed
    assert queue_delay(before, TritonQueue(0, 1.0, 5)) is None  # Triton restarted
