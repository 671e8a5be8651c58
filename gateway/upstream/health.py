"""Active health checks: poll every replica's readiness and mark it in its pool; after
each round of a model, publish its state for `/metrics` (see `metrics.publish_state`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from gateway.backends.http import LazySession
from gateway.backends.triton_metrics import TritonQueue, queue_delay, scrape_queue
from gateway.observability import metrics
from gateway.upstream.pool import QUEUE_DELAY_STEP_S, Replica
from gateway.upstream.route import ModelRoute

log = logging.getLogger("gateway.health")


class HealthChecker:
    """Polls each replica of each model at the model's configured interval."""

    def __init__(
        self, routes: Iterable[ModelRoute], on_change: Callable[[str], None] | None = None
    ) -> None:
        self._routes = list(routes)
        # Told the model's name when a replica's health or queue changes.
        self._on_change = on_change
        # For scraping the Triton replicas' own metrics.
        self._session = LazySession(connect_timeout_s=1.0)
        self._tasks: list[asyncio.Task[None]] = []

    async def check_all(self) -> None:
        """One round of checks, for every replica at once."""
        await asyncio.gather(*(self._check_route(route) for route in self._routes))

    async def _check_route(self, route: ModelRoute) -> None:
        async def check(replica: Replica) -> None:
            ready = await route.backend.ready(
                replica.url, route.upstream_model, route.config.health.timeout_s
            )
            healthy = _verdict(replica, ready, route.config.health.unhealthy_after)
            changed = healthy != replica.healthy
            if changed:
                state = "healthy" if healthy else "unhealthy"
                log.warning(
                    "replica %s of %s is now %s",
                    replica.url,
                    route.name,
                    state,
                    extra={"fields": {"event": "health", "model": route.name,
                                      "replica": replica.url, "state": state}},
                )  # fmt: skip
            route.pool.mark_checked(replica, healthy)
            if replica.metrics_url is not None:
                queue = await scrape_queue(
                    self._session.get(),
                    replica.metrics_url,
                    route.upstream_model,
                    route.config.health.timeout_s,
                )
                pending = queue.pending if queue else 0
                changed = changed or pending != replica.upstream_pending
                replica.upstream_pending = pending
                # A counter, re-exported: without an answer it keeps its last value (0
                # would read as a counter reset, and its rate as a spike).
                if queue is not None:
                    _follow(replica, queue)
            if changed and self._on_change is not None:
                self._on_change(route.name)

        # A snapshot: a new placement may change the pool while the checks run.
        await asyncio.gather(*(check(replica) for replica in list(route.pool.replicas)))
        metrics.publish_state(route.name)

    async def _loop(self, route: ModelRoute) -> None:
        while True:
            await asyncio.sleep(route.config.health.interval_s)
            try:
                await self._check_route(route)
            except Exception:  # a failed check must not end the checking
                log.exception("health check of %s failed", route.name)

    def start(self) -> None:
        """Begin polling in the background."""
        self._tasks = [asyncio.create_task(self._loop(route)) for route in self._routes]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        await self._session.close()


def _verdict(replica: Replica, ready: bool, unhealthy_after: int) -> bool:
    """Whether `replica` is healthy after a check that found it `ready` or not: one that
    has passed a check stays in until `unhealthy_after` checks in a row fail."""
    if ready:
        replica.passed_a_check, replica.failed_checks = True, 0
        return True
    replica.failed_checks += 1
    return replica.healthy and replica.passed_a_check and replica.failed_checks < unhealthy_after


def _follow(replica: Replica, queue: TritonQueue) -> None:
    """Take in a scrape of the replica's Triton queue; its recent queue delay is kept when
    no request completed since the last scrape."""
    before = TritonQueue(
        replica.upstream_pending, replica.upstream_queue_seconds, replica.upstream_requests
    )
    replica.upstream_queue_seconds = queue.queue_seconds
    replica.upstream_requests = queue.requests
    delay = queue_delay(before, queue)
    if delay is not None:
        replica.upstream_delay_steps = int(delay / QUEUE_DELAY_STEP_S)
