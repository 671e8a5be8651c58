"""Per-request replica choice.

`least_load`: the healthy replica with the fewest outstanding requests; among equals,
the one whose Triton queue has been quickest lately, then each in turn.

`cache_aware`, for a request with a ring key (`gateway.upstream.affinity`): the key's
owner on the consistent-hash ring (`gateway.upstream.ring`), whose prefix cache most
likely holds the prompt's start, unless that would put it above the load bound; then the
next replica on the ring that is within it (consistent hashing with bounded loads,
Mirrokni, Thorup and Zadimoghaddam 2018, as HAProxy's `hash-balance-factor`). The bound
is `load_factor` times the mean load of the replicas that may take the request, this one
counted, rounded up: the least-loaded replica is always within it, so a hot prefix spreads
over the ring instead of piling on its owner.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from gateway.upstream.ring import HashRing

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


class Skip(StrEnum):
    """Why a request's preferred replica (its key's owner) did not take it."""

    LOAD = "load"  # above the load bound, or at its in-flight cap
    UNAVAILABLE = "unavailable"  # failing its health check, or ejected


@dataclass(frozen=True, slots=True)
class Choice:
    """A replica for a request (None: none can take it), and why the preferred one was
    passed over, if it was."""

    replica: Replica | None
    skipped: Skip | None = None


NO_CHOICE = Choice(None)


class Lease:
    """`ReplicaPool.lease`'s context manager: a class, as it runs on every request (a
    `contextlib.contextmanager` costs a generator and its wrapper)."""

    __slots__ = ("_replica",)

    def __init__(self, replica: Replica) -> None:
        self._replica = replica

    def __enter__(self) -> Replica:
        replica = self._replica
        replica.outstanding += 1
        replica.served += 1
        return replica

    def __exit__(self, *exc: object) -> None:
        self._replica.outstanding -= 1


class ReplicaPool:
    """The replicas of one model, with the gateway's own count of in-flight requests.

    Triton reports 0 pending requests for streaming (decoupled) models, so the
    gateway's count is the one to balance on.
    """

    def __init__(
        self,
        urls: Sequence[str],
        metrics_urls: Sequence[str | None] = (),
        *,
        load_factor: float = 1.25,
        ring_points: int = 100,
    ) -> None:
        self.replicas = [Replica(url) for url in urls]
        # Replicas a new placement took out while requests were still on them.
        self._leaving: list[Replica] = []
        for replica, metrics_url in zip(self.replicas, metrics_urls, strict=False):
            replica.metrics_url = metrics_url
        self.load_factor = load_factor
        self._ring_points = ring_points
        self._ring = HashRing(urls, ring_points)

    @property
    def ready(self) -> bool:
        return any(r.healthy for r in self.replicas)

    def pick(
        self,
        exclude: Sequence[Replica] = (),
        available: Callable[[Replica], bool] | None = None,
        max_in_flight: int | None = None,
        key: int | None = None,
    ) -> Replica | None:
        """`choose`'s replica."""
        return self.choose(exclude, available, max_in_flight, key).replica

    def choose(
        self,
        exclude: Sequence[Replica] = (),
        available: Callable[[Replica], bool] | None = None,
        max_in_flight: int | None = None,
        key: int | None = None,
    ) -> Choice:
        """A healthy replica not in `exclude`, with fewer than `max_in_flight` of the
        gateway's requests outstanding, and `available` (the passive outlier check), when
        those are given: `key`'s first on the ring within the load bound, or with no key
        the least-loaded one."""

        if key is None:
            # The usual case, on every request: one pass, no closure, no generator. The
            # checks run in `usable`'s order: `available` has side effects (it may open a
            # half-open replica's probe slot), so it is asked only of replicas that pass
            # the others.
            best: Replica | None = None
            best_rank: tuple[int, int, int] | None = None
            for replica in self.replicas:
                if (
                    not replica.healthy
                    or replica in exclude
                    or (max_in_flight is not None and replica.outstanding >= max_in_flight)
                    or (available is not None and not available(replica))
                ):
                    continue
                rank = (replica.load, replica.upstream_delay_steps, replica.served)
                if best_rank is None or rank < best_rank:
                    best, best_rank = replica, rank
            return NO_CHOICE if best is None else Choice(best)

        def usable(replica: Replica) -> bool:
            return (
                replica.healthy
                and replica not in exclude
                and (max_in_flight is None or replica.outstanding < max_in_flight)
                and (available is None or available(replica))
            )

        order = [self.replicas[i] for i in self._ring.walk(key)]
        candidates = [r for r in order if usable(r)]
        if not candidates:
            return NO_CHOICE
        total = sum(r.load for r in candidates) + 1
        bound = math.ceil(self.load_factor * total / len(candidates))
        chosen = next(r for r in candidates if r.load + 1 <= bound)
        owner = order[0]
        if chosen is owner or owner in exclude:  # taken, or tried already (a retry)
            return Choice(chosen)
        # Passed over though it could serve: above the bound, or at its in-flight cap.
        serves = owner.healthy and (available is None or available(owner))
        return Choice(chosen, Skip.LOAD if serves else Skip.UNAVAILABLE)

    def lease(self, replica: Replica) -> Lease:
        """Count a request against `replica` while it runs (a `with` block)."""
        return Lease(replica)

    def set_urls(self, urls: Sequence[str], metrics_urls: Sequence[str | None] = ()) -> None:
        """Serve from `urls` from now on (a new placement). Replicas that stay keep their
        counts (and their keys on the ring); the list is changed in place, as others
        hold it."""
        current = {r.url: r for r in self._leaving} | {r.url: r for r in self.replicas}
        replicas = []
        for index, url in enumerate(urls):
            replica = current.get(url) or Replica(url)
            if replica.url not in current and index < len(metrics_urls):
                replica.metrics_url = metrics_urls[index]
            replicas.append(replica)
        kept = set(urls)
        self._leaving = [r for r in current.values() if r.url not in kept and r.outstanding]
        self.replicas[:] = replicas
        if tuple(urls) != self._ring.urls:
            self._ring = HashRing(urls, self._ring_points)

    def draining(self) -> dict[str, int]:
        """The replicas taken out of the pool with this gateway's requests still on them,
        by URL: what a move waits for before it unloads them."""
        self._leaving = [r for r in self._leaving if r.outstanding]
        return {r.url: r.outstanding for r in self._leaving}

    def mark_checked(self, replica: Replica, healthy: bool) -> None:
        """Record the result of an active health check."""
        replica.healthy = healthy
