"""Per-request replica choice: the healthy replica with the fewest outstanding requests;
among equals, the one whose Triton queue has been quickest lately, then each in turn."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

# Triton queue delays are compared in steps of this many seconds.
QUEUE_DELAY_STEP_S = 0.01


@dataclass(eq=False, slots=True)
class Replica:
    """One upstream server of a model, as the gateway sees it."""

    url: str
    outstanding: int = 0
    healthy: bool = True
    # Active checks: whether one has passed yet, and how many failed since the last pass.
    passed_a_check: bool = False
    failed_checks: int = 0
    # Triton's own count of requests queued on this replica (all clients), the
    # cumulative time requests spent in that queue and the requests it completed,
    # scraped from its metrics endpoint.
    upstream_pending: int = 0
    upstream_queue_seconds: float = 0.0
    upstream_requests: float = 0.0
    # Between the last two scrapes, the mean time a request waited in Triton's queue, in
    # whole QUEUE_DELAY_STEP_S (finer differences are noise). Breaks ties in load.
    upstream_delay_steps: int = 0
    metrics_url: str | None = None
    # Requests sent here over the gateway's life; breaks ties in turn.
    served: int = field(default=0)

    @property
    def external(self) -> int:
        """Requests queued on the replica that are not the gateway's own."""
        return max(0, self.upstream_pending - self.outstanding)

    @property
    def load(self) -> int:
        """The gateway's requests in flight here, plus other clients' queued ones."""
        return self.outstanding + self.external


class ReplicaPool:
    """The replicas of one model, with the gateway's own count of in-flight requests.

    Triton reports 0 pending requests for streaming (decoupled) models, so the
    gateway's count is the one to balance on.
    """

    def __init__(self, urls: Sequence[str], metrics_urls: Sequence[str | None] = ()) -> None:
        self.replicas = [Replica(url) for url in urls]
        for replica, metrics_url in zip(self.replicas, metrics_urls, strict=False):
            replica.metrics_url = metrics_url

    @property
    def ready(self) -> bool:
        return any(r.healthy for r in self.replicas)

    def pick(
        self,
        exclude: Sequence[Replica] = (),
        available: Callable[[Replica], bool] | None = None,
        max_in_flight: int | None = None,
    ) -> Replica | None:
        """The least-loaded healthy replica not in `exclude`, with fewer than
        `max_in_flight` of the gateway's requests outstanding, and `available` (the passive
        outlier check), when those are given; or None."""
        best: Replica | None = None
        for replica in self.replicas:
            if not replica.healthy or replica in exclude:
                continue
            if max_in_flight is not None and replica.outstanding >= max_in_flight:
                continue
            if available is not None and not available(replica):
                continue
            if best is None or (replica.load, replica.upstream_delay_steps, replica.served) < (
                best.load,
                best.upstream_delay_steps,
                best.served,
            ):
                best = replica
        return best

    @contextmanager
    def lease(self, replica: Replica) -> Iterator[Replica]:
        """Count a request against `replica` while it runs."""
        replica.outstanding += 1
        replica.served += 1
        try:
            yield replica
        finally:
            replica.outstanding -= 1

    def set_urls(self, urls: Sequence[str], metrics_urls: Sequence[str | None] = ()) -> None:
        """Serve from `urls` from now on (a new placement). Replicas that stay keep their
        counts; the list is changed in place, as others hold it."""
        current = {r.url: r for r in self.replicas}
        replicas = []
        for index, url in enumerate(urls):
            replica = current.get(url) or Replica(url)
            if replica.url not in current and index < len(metrics_urls):
                replica.metrics_url = metrics_urls[index]
            replicas.append(replica)
        self.replicas[:] = replicas

    def mark_checked(self, replica: Replica, healthy: bool) -> None:
        """Record the result of an active health check."""
        replica.healthy = healthy
