"""Send a request to a replica, and to another one when the first cannot take it.

A request moves to another replica only while nothing has been generated for it, so a
client never sees output twice. Each move waits an exponential backoff with full
jitter and spends from the model's retry budget, so a fleet-wide failure does not turn
into a retry storm.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator

from gateway.backends.base import ReplicaUnavailable
from gateway.inference import Completion, Delta, UpstreamCall
from gateway.observability import metrics
from gateway.resilience.outlier import ReplicaState
from gateway.routes import ModelRoute
from gateway.scheduler.routing import Replica

log = logging.getLogger("gateway.failover")


class NoReplicaLeft(Exception):
    """Every replica tried was unavailable, none was healthy, or the retry budget ran out."""

    def __init__(self, model: str, last_error: Exception | None) -> None:
        detail = f": {last_error}" if last_error else ""
        super().__init__(f"no replica of {model} could take the request{detail}")
        self.last_error = last_error


async def _candidates(route: ModelRoute, deadline: float) -> AsyncIterator[Replica]:
    """Replicas to try in turn, each the least loaded of the available ones not yet tried;
    before each retry, the budget is asked and the backoff waited."""
    resilience = route.resilience
    resilience.budget.record_request()
    tried: list[Replica] = []
    while len(tried) < route.config.max_attempts:
        if tried:
            if not resilience.budget.try_spend():
                metrics.RETRY_BUDGET_EXHAUSTED.labels(route.name).inc()
                return
            metrics.RETRIES.labels(route.name).inc()
            delay = resilience.backoff.delay(len(tried) - 1)
            if time.monotonic() + delay >= deadline:
                return
            await asyncio.sleep(delay)
        # Picked after the backoff, with fresh load figures; the caller leases it at once
        # (the outlier detector's single half-open probe relies on that).
        replica = route.pool.pick(tried, resilience.outlier.available)
        if replica is None:
            return
        tried.append(replica)
        yield replica


async def complete(route: ModelRoute, call: UpstreamCall, deadline: float) -> Completion:
    """Run `call` to completion on the least-loaded replica, failing over if it is down."""
    last_error: Exception | None = None
    outlier = route.resilience.outlier
    async for replica in _candidates(route, deadline):
        with route.pool.lease(replica):
            try:
                completion = await route.backend.complete(replica.url, call)
            except ReplicaUnavailable as exc:
                _failed(route, replica)
                last_error = exc
                continue
            outlier.record_success(replica)
            _served(route, replica, completion.usage.completion_tokens)
            return completion
    raise NoReplicaLeft(route.name, last_error)


async def stream(
    route: ModelRoute, call: UpstreamCall, deadline: float
) -> AsyncGenerator[Delta, None]:
    """Stream `call` from the least-loaded replica; fail over until the first piece arrives.

    The replica stays leased until the stream ends or is closed.
    """
    last_error: Exception | None = None
    outlier = route.resilience.outlier
    async for replica in _candidates(route, deadline):
        with route.pool.lease(replica):
            upstream = route.backend.stream(replica.url, call)
            try:
                try:
                    first = await anext(upstream)
                except StopAsyncIteration:
                    outlier.record_success(replica)
                    _served(route, replica, 0)
                    return
                except ReplicaUnavailable as exc:
                    _failed(route, replica)
                    last_error = exc
                    continue
                outlier.record_success(replica)
                pieces = 1
                yield first
                try:
                    async for delta in upstream:
                        pieces += 1
                        yield delta
                except ReplicaUnavailable:
                    # Died mid-stream: too late to move this request, not too late to spare others.
                    _failed(route, replica)
                    raise
                finally:
                    # About one token per piece: the replica's effective throughput.
                    _served(route, replica, pieces)
                return
            finally:
                await upstream.aclose()
    raise NoReplicaLeft(route.name, last_error)


def _served(route: ModelRoute, replica: Replica, tokens: int) -> None:
    metrics.labels(metrics.REPLICA_REQUESTS, route.name, replica.url).inc()
    metrics.labels(metrics.REPLICA_TOKENS, route.name, replica.url).inc(tokens)


def _failed(route: ModelRoute, replica: Replica) -> None:
    """Tell the outlier detector, and count an ejection when this failure caused one."""
    outlier = route.resilience.outlier
    before = outlier.state(replica)
    outlier.record_failure(replica)
    if outlier.state(replica) is ReplicaState.EJECTED and before is not ReplicaState.EJECTED:
        metrics.REPLICA_EJECTIONS.labels(route.name, replica.url).inc()
        log.warning(
            "replica ejected",
            extra={"fields": {"event": "ejection", "model": route.name, "replica": replica.url}},
        )
