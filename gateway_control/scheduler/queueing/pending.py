"""The replay's queue of jobs waiting to start: per tenant, by priority then by when each
job was queued; and the preemption victims that join it after the current pass. Pure."""

from __future__ import annotations

from bisect import insort
from collections.abc import Iterable, Sequence

from gateway_control.scheduler.queueing.runs import PENDING, JobRun

Entry = tuple[tuple[int, float, int], int]  # ((-priority, queued at, index), index)


class PendingQueue:
    """Waiting jobs (by index into the replay's runs), one queue per tenant."""

    def __init__(self, tenants: Iterable[str]) -> None:
        self._queues: dict[str, list[Entry]] = {t: [] for t in tenants}
        self.count = 0
        self._deferred: list[int] = []

    def enqueue(self, run: JobRun, now: float) -> None:
        """Queue `run` (arriving, or stopped by a failure) from `now`."""
        run.state = PENDING
        run.ready_at = now
        entry = ((-run.job.priority, now, run.index), run.index)
        queue = self._queues[run.job.tenant]
        if queue and entry < queue[-1]:
            # Requeued jobs keep priority order; arrivals mostly append.
            insort(queue, entry)
        else:
            queue.append(entry)
        self.count += 1

    def waiting(self) -> dict[str, list[int]]:
        """Each tenant with jobs waiting, and its jobs in queue order."""
        return {t: [i for _, i in q] for t, q in self._queues.items() if q}

    def remove(self, started: set[int], tenants: Iterable[str]) -> None:
        """Take the jobs in `started` (all of `tenants`) out of the queue."""
        for tenant in tenants:
            self._queues[tenant] = [e for e in self._queues[tenant] if e[1] not in started]
        self.count -= len(started)

    def defer(self, index: int) -> None:
        """Queue a preempted job once the current pass is over (`requeue_deferred`)."""
        self._deferred.append(index)

    def requeue_deferred(self, runs: Sequence[JobRun], now: float) -> bool:
        """Queue the deferred victims; whether there were any."""
        if not self._deferred:
            return False
        for index in self._deferred:
            self.enqueue(runs[index], now)
        self._deferred.clear()
        return True
