"""This gateway's demand, put on the board (`demand_board`) every interval.

Every gateway reports, leader or not: the admission controller's counters and gauges per
model (and per priority class: requests, the tokens they reserved, what waits and runs),
and the p95 of time to first token over the interval, read from the
`gateway_time_to_first_token_seconds` histogram's buckets (the difference since the last
report; the bound of the bucket the 95th percentile falls in, so it errs high). Redis
unreachable: the report is skipped (it would be stale when read anyway), logged once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable

from gateway.admission import AdmissionController
from gateway.observability import metrics
from gateway.storage.redis_client import REDIS_ERRORS
from gateway_control.placement.demand_board import (
    ClassReport,
    DemandBoard,
    GatewayReport,
    ModelReport,
)

log = logging.getLogger("gateway.placement")

BucketCounts = dict[float, float]  # upper bound -> cumulative count


def gateway_id() -> str:
    """A name for this gateway process on the board: host, pid and a random part (a
    restarted gateway is a new one: its counters start again)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class TtftWindow:
    """The p95 of time to first token per model since the last look, from the histogram."""

    def __init__(self, read: Callable[[], dict[str, BucketCounts]] | None = None) -> None:
        self._read = read or _ttft_buckets
        self._last: dict[str, BucketCounts] = {}

    def p95(self) -> dict[str, float]:
        """Per model with first tokens since the last call: their p95, in seconds (the
        upper bound of its bucket; the largest finite bound for the +Inf bucket)."""
        now = self._read()
        found = {}
        for model, buckets in now.items():
            before = self._last.get(model, {})
            delta = {bound: count - before.get(bound, 0.0) for bound, count in buckets.items()}
            total = delta.get(math.inf, 0.0)
            if total <= 0:
                continue
            finite = [b for b in sorted(delta) if b != math.inf]
            for bound in sorted(delta):
                if delta[bound] >= 0.95 * total:
                    found[model] = bound if bound != math.inf else (finite[-1] if finite else 0.0)
                    break
        self._last = now
        return found


def _ttft_buckets() -> dict[str, BucketCounts]:
    found: dict[str, BucketCounts] = {}
    for family in metrics.TTFT.collect():
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                bound = float(sample.labels["le"])
                found.setdefault(sample.labels["model"], {})[bound] = sample.value
    return found


class DemandReporter:
    """Publishes this gateway's report every `interval_s` while running."""

    def __init__(
        self,
        board: DemandBoard,
        admission: AdmissionController,
        models: Iterable[str],
        interval_s: float,
        *,
        gateway: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        ttft: TtftWindow | None = None,
        moves: Callable[[], tuple[str, dict[str, dict[str, int]]]] | None = None,
    ) -> None:
        self._board = board
        self._admission = admission
        self._models = list(models)
        self._interval_s = interval_s
        self.gateway = gateway or gateway_id()
        self._clock = clock
        self._ttft = ttft or TtftWindow()
        # The placement this gateway serves from, and its requests on replicas that left.
        self._moves = moves
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    def report(self) -> GatewayReport:
        """What this gateway sees now."""
        ttft = self._ttft.p95()
        models = {}
        for model in self._models:
            seen = self._admission.snapshot(model)
            classes = {
                name: ClassReport(
                    c.arrivals, c.tokens, seen.queued.get(name, 0), c.queued_tokens, c.in_flight
                )
                for name, c in seen.by_class.items()
            }
            models[model] = ModelReport(
                seen.arrivals, seen.completions, seen.busy_s, sum(seen.queued.values()),
                seen.in_flight, ttft.get(model), seen.completed_tokens, classes,
            )  # fmt: skip
        plan, draining = ("", {}) if self._moves is None else self._moves()
        return GatewayReport(self.gateway, self._clock(), models, plan, draining)

    async def publish_once(self) -> bool:
        """Publish a report now; whether Redis took it."""
        try:
            await self._board.publish(self.report())
        except REDIS_ERRORS as exc:
            if not self._failing:
                log.warning("demand report not published (Redis: %s); trying each interval", exc)
            self._failing = True
            return False
        if self._failing:
            log.warning("demand reports published again")
        self._failing = False
        return True

    def start(self) -> None:
        """Publish from now on, every interval."""
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await self.publish_once()
            await asyncio.sleep(self._interval_s)
