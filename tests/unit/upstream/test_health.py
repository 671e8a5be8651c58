"""Active health checks: each round checks every replica and scrapes its Triton queue."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gateway.backends.triton_metrics import TritonQueue
from gateway.upstream import health
from gateway.upstream.pool import Replica


def scripted_checker(
    monkeypatch: pytest.MonkeyPatch,
    answers: list[TritonQueue | None],
    readiness: list[bool] | None = None,
) -> tuple[health.HealthChecker, Replica]:
    """A health checker of one replica whose Triton scrapes give `answers` and whose
    readiness checks `readiness` (ready, if not given), one per round of checks."""
    replica = Replica("http://r1:8000", metrics_url="http://r1:8002/metrics")

    async def ready(*_: object) -> bool:
        return readiness.pop(0) if readiness else True

    route = SimpleNamespace(
        name="not-watched",
        upstream_model="m",
        backend=SimpleNamespace(ready=ready),
        config=SimpleNamespace(health=SimpleNamespace(timeout_s=1.0, unhealthy_after=2)),
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


async def test_a_replica_that_passed_a_check_is_out_only_after_two_failures_in_a_row(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One check can time out while the replica's Triton loads another model: that alone
    must not take a healthy replica out (the demo's other model answered 503 for 1 s)."""
    rounds = [True, False, True, False, False, True]
    checker, replica = scripted_checker(monkeypatch, [None] * len(rounds), list(rounds))
    seen = []
    try:
        for _ in rounds:
            await checker.check_all()
            seen.append(replica.healthy)
    finally:
        await checker.stop()
    assert seen == [True, True, True, True, False, True]


async def test_a_replica_never_seen_ready_is_out_at_its_first_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checker, replica = scripted_checker(monkeypatch, [None, None], [False, True])
    try:
        await checker.check_all()
        assert replica.healthy is False  # down from the start: not served for a round
        await checker.check_all()
        assert replica.healthy is True
    finally:
        await checker.stop()
