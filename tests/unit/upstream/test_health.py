"""Active health checks: each round checks every replica and scrapes its Triton queue."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gateway.backends.triton_metrics import TritonQueue
from gateway.upstream import health
from gateway.upstream.pool import Replica


def scripted_checker(
    monkeypatch: pytest.MonkeyPatch, answers: list[TritonQueue | None]
) -> tuple[health.HealthChecker, Replica]:
    """A health checker of one always-ready replica whose Triton scrapes give `answers`,
    one per round of checks."""
    replica = Replica("http://r1:8000", metrics_url="http://r1:8002/metrics")

    async def ready(*_: object) -> bool:
        return True

    route = SimpleNamespace(
        name="not-watched",
        upstream_model="m",
        backend=SimpleNamespace(ready=ready),
        config=SimpleNamespace(health=SimpleNamespace(timeout_s=1.0)),
        pool=SimpleNamespace(
            replicas=[replica], mark_checked=lambda r, ok: setattr(r, "healthy", ok)
        ),
    )

    async def scrape(*_: object) -> TritonQueue | None:
        return answers.pop(0)

    monkeypatch.setattr(health, "scrape_queue", scrape)
    return health.HealthChecker([route]), replica  # type: ignore[list-item]


async def test_a_failed_triton_scrape_keeps_the_queue_counter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checker, replica = scripted_checker(monkeypatch, [TritonQueue(2, 7.5), None])
    try:
        await checker.check_all()
        assert (replica.upstream_pending, replica.upstream_queue_seconds) == (2, 7.5)
        await checker.check_all()  # the scrape fails
        assert (replica.upstream_pending, replica.upstream_queue_seconds) == (0, 7.5)
    finally:
        await checker.stop()


async def test_triton_scrapes_give_each_replica_its_recent_queue_delay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Queue time and completed requests between two scrapes: 2 s over 40 requests is
    50 ms a request, which routing compares in 10 ms steps."""
    answers: list[TritonQueue | None] = [
        TritonQueue(0, 10.0, 100),
        TritonQueue(0, 12.0, 140),
        TritonQueue(0, 12.0, 140),
    ]
    checker, replica = scripted_checker(monkeypatch, answers)
    try:
        await checker.check_all()
        await checker.check_all()
        assert replica.upstream_delay_steps == 5
        await checker.check_all()  # nothing completed since: the last delay stays
        assert replica.upstream_delay_steps == 5
    finally:
        await checker.stop()
