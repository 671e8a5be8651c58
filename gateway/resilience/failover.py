"""Send a request to a replica, and to another one when the first cannot take it.

A request moves to another replica only while nothing has been generated for it, so a
client never sees output twice.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterator

from gateway.backends.base import ReplicaUnavailable
from gateway.inference import Completion, Delta, UpstreamCall
from gateway.routes import ModelRoute
from gateway.scheduler.routing import Replica


class NoReplicaLeft(Exception):
    """Every replica tried was unavailable, or none was healthy."""

    def __init__(self, model: str, last_error: Exception | None) -> None:
        detail = f": {last_error}" if last_error else ""
        super().__init__(f"no replica of {model} could take the request{detail}")
        self.last_error = last_error


def _candidates(route: ModelRoute) -> Iterator[Replica]:
    """Replicas to try in turn: each the least loaded of the healthy ones not yet tried."""
    tried: list[Replica] = []
    while len(tried) < route.config.max_attempts:
        replica = route.pool.pick(tried)
        if replica is None:
            return
        tried.append(replica)
        yield replica


async def complete(route: ModelRoute, call: UpstreamCall) -> Completion:
    """Run `call` to completion on the least-loaded replica, failing over if it is down."""
    last_error: Exception | None = None
    for replica in _candidates(route):
        with route.pool.lease(replica):
            try:
                return await route.backend.complete(replica.url, call)
            except ReplicaUnavailable as exc:
                route.pool.mark_failed(replica)
                last_error = exc
    raise NoReplicaLeft(route.name, last_error)


async def stream(route: ModelRoute, call: UpstreamCall) -> AsyncGenerator[Delta, None]:
    """Stream `call` from the least-loaded replica; fail over until the first piece arrives.

    The replica stays leased until the stream ends or is closed.
    """
    last_error: Exception | None = None
    for replica in _candidates(route):
        with route.pool.lease(replica):
            upstream = route.backend.stream(replica.url, call)
            try:
                try:
                    first = await anext(upstream)
                except StopAsyncIteration:
                    return
                except ReplicaUnavailable as exc:
                    route.pool.mark_failed(replica)
                    last_error = exc
                    continue
                yield first
                try:
                    async for delta in upstream:
                        yield delta
                except ReplicaUnavailable:
                    # Died mid-stream: too late to move this request, not too late to spare others.
                    route.pool.mark_failed(replica)
                    raise
                return
            finally:
                await upstream.aclose()
    raise NoReplicaLeft(route.name, last_error)
