"""Passive outlier ejection: a replica whose requests keep failing is left out for a while.

The active health check (`health.py`) asks each replica whether it is ready; this is the
passive side, judging replicas by the outcomes of real requests:

- in service: `consecutive_failures` failures in a row eject the replica;
- ejected: no requests for a cool-down of `base_ejection_s`, doubled for each ejection
  in a row (up to `max_ejection_s`); outcomes reported meanwhile change nothing;
- half-open: after the cool-down ONE probe request may go; the next outcome reported
  decides: a success puts the replica back in service and forgets its history, a
  failure ejects it again for twice as long.

The router asks `available(replica)` (or `eligible(replicas)`) for each candidate. A
probe needs no extra call: the detector watches the pool's own counters. The probe slot
is taken once the pool has leased the replica since the cool-down ended
(`Replica.served` moved on) while that request is outstanding; a probe that ends
without an outcome (a cancelled request) frees the slot once the replica has nothing
outstanding. The router should therefore lease a replica right after choosing it, with
no await in between.

Panic mode: requests never go to an ejected replica while a healthy one (healthy by the
active check and not ejected) exists. When every healthy replica is ejected, the one
whose cool-down ends first takes the traffic, as in Envoy's panic threshold, rather
than failing every request; it is also the one the detector would trust again
soonest. Only that one: a fleet-wide outage does not fan out across all replicas.
`available` knows the other replicas through the `replicas` given at construction
(pass `pool.replicas`); without them it never panics.

State is the detector's own: `Replica` and `ReplicaPool` are only read. Whoever counts
capacity from the replicas in use sets `on_change`: it is told the replica when one is
ejected or put back in service, and can ask `cooldown_end` when to look again.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from gateway.upstream.pool import Replica

# 2.0**1024 overflows a float; past this the cool-down is the maximum anyway.
_MAX_EXPONENT = 1023


class ReplicaState(StrEnum):
    """Where a replica stands with the detector."""

    IN_SERVICE = "in_service"
    EJECTED = "ejected"  # cooling down: no requests (but see panic mode)
    HALF_OPEN = "half_open"  # cool-down over: one probe at a time


@dataclass(slots=True)
class _Record:
    """A replica's history; replicas without one are in service with a clean slate."""

    # Failures in a row while in service.
    failures: int = 0
    # Ejections in a row, without a success in between: sets the cool-down.
    ejections: int = 0
    # When the cool-down ends; None while in service.
    until: float | None = None
    # `Replica.served` when the probe slot last opened; None until the cool-down is over.
    probe_mark: int | None = None


class OutlierDetector:
    """Ejects the replicas of one pool that fail too often. One event loop uses it."""

    __slots__ = ("_base_s", "_clock", "_max_s", "_records", "_replicas", "_threshold", "on_change")

    def __init__(
        self,
        consecutive_failures: int,
        base_ejection_s: float,
        max_ejection_s: float,
        clock: Callable[[], float] = time.monotonic,
        *,
        replicas: Sequence[Replica] = (),
    ) -> None:
        if consecutive_failures < 1:
            raise ValueError(f"consecutive_failures must be >= 1, not {consecutive_failures}")
        # Written as positive checks so NaN fails them too.
        if not (0 < base_ejection_s <= max_ejection_s < math.inf):
            raise ValueError(
                "ejection times must satisfy 0 < base_ejection_s <= max_ejection_s, not "
                f"{base_ejection_s} and {max_ejection_s}"
            )
        self._threshold = consecutive_failures
        self._base_s = base_ejection_s
        self._max_s = max_ejection_s
        self._clock = clock
        # Kept by reference: the pool's own list, for panic mode.
        self._replicas = replicas
        self._records: dict[Replica, _Record] = {}
        # Told the replica after it was ejected or put back in service.
        self.on_change: Callable[[Replica], None] | None = None

    def state(self, replica: Replica) -> ReplicaState:
        """Whether `replica` is in service, ejected, or past its cool-down (for metrics)."""
        record = self._records.get(replica)
        if record is None or record.until is None:
            return ReplicaState.IN_SERVICE
        if self._clock() < record.until:
            return ReplicaState.EJECTED
        return ReplicaState.HALF_OPEN

    def cooldown_end(self, replica: Replica) -> float | None:
        """When `replica`'s cool-down ends (on the detector's clock); None in service."""
        record = self._records.get(replica)
        return None if record is None else record.until

    def available(self, replica: Replica) -> bool:
        """Whether a new request may go to `replica`, as far as outlier ejection goes.

        True in service, for a free probe slot after the cool-down, and for the panic
        replica when every healthy replica is ejected. Does not look at
        `replica.healthy` for the replica itself: the router checks that.
        """
        if not self._records:
            return True  # every replica in service with a clean slate: the usual case
        now = self._clock()
        if self._admits(replica, now):
            return True
        return self._panic_choice(self._replicas, now) is replica

    def eligible(self, replicas: Iterable[Replica]) -> list[Replica]:
        """The healthy replicas of `replicas` a new request may go to, in order.

        Those not ejected (and half-open ones with a free probe slot); if there are none,
        the healthy ejected replica whose cool-down ends first (panic mode); if no
        replica is healthy, none.
        """
        now = self._clock()
        healthy = [r for r in replicas if r.healthy]
        admitted = [r for r in healthy if self._admits(r, now)]
        if admitted or not healthy:
            return admitted
        return [self._soonest_back(healthy)]

    def record_success(self, replica: Replica) -> None:
        """A request to `replica` succeeded: in service or half-open, its history is reset."""
        record = self._records.get(replica)
        if record is None:
            return
        if record.until is None:
            del self._records[replica]
        elif self._clock() >= record.until:
            del self._records[replica]
            self._changed(replica)  # back in service
        # During the cool-down, a success (a request sent before the ejection, or in
        # panic mode) does not cut it short: the half-open probe decides.

    def record_failure(self, replica: Replica, *, doubtful: bool = False) -> None:
        """A request to `replica` failed because of the replica (not the client).

        `doubtful`: the request itself may explain the failure (a long prompt's first
        token late: `failover`); it counts only against a replica already failing, one
        with a failure since its last success (or ejected), never against a clean slate,
        so a tenant's requests of one shape cannot eject a replica that serves others.
        """
        now = self._clock()
        record = self._records.get(replica)
        if record is None:
            if doubtful:
                return
            record = self._records[replica] = _Record()
        if record.until is None:
            record.failures += 1
            if record.failures >= self._threshold:
                self._eject(record, now)
                self._changed(replica)
        elif now >= record.until:
            # Half-open: the probe (or whatever reported first) failed.
            self._eject(record, now)
            self._changed(replica)
        # During the cool-down, failures change nothing (they are mostly requests that
        # were in flight when the replica was ejected).

    def _changed(self, replica: Replica) -> None:
        if self.on_change is not None:
            self.on_change(replica)

    def _eject(self, record: _Record, now: float) -> None:
        record.ejections += 1
        record.failures = 0
        record.probe_mark = None
        exponent = min(record.ejections - 1, _MAX_EXPONENT)
        record.until = now + min(self._max_s, self._base_s * 2.0**exponent)

    def _admits(self, replica: Replica, now: float) -> bool:
        """Available without panic: in service, or half-open with the probe slot free."""
        record = self._records.get(replica)
        if record is None or record.until is None:
            return True
        if now < record.until:
            return False
        if record.probe_mark is None or (
            replica.served > record.probe_mark and replica.outstanding == 0
        ):
            # The cool-down has just been seen to end, or the last probe ended with no
            # outcome reported (cancelled): open the slot from the current count.
            record.probe_mark = replica.served
        # A lease since the slot opened is the probe, in flight until an outcome arrives.
        return replica.served == record.probe_mark

    def _panic_choice(self, replicas: Sequence[Replica], now: float) -> Replica | None:
        """The replica to use when every healthy one is ejected, else None."""
        healthy = [r for r in replicas if r.healthy]
        if not healthy or any(self._admits(r, now) for r in healthy):
            return None
        return self._soonest_back(healthy)

    def _soonest_back(self, ejected: Sequence[Replica]) -> Replica:
        """Of replicas that all have a cool-down, the one that ends first (ties: first)."""

        def until(replica: Replica) -> float:
            cooldown_end = self._records[replica].until
            return math.inf if cooldown_end is None else cooldown_end

        return min(ejected, key=until)
