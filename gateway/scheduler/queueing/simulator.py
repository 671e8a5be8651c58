"""Discrete-event replay of a job trace: placement, quotas, fair share, preemption, failures.

Events are arrivals, completions, node failures and repairs; after each instant's events
one scheduling pass runs. A pass goes through the pending jobs tenant by tenant, always
taking the next job of the tenant with the lowest fair share (borrowed GPU per weight),
each tenant's jobs by priority then by when they were queued; a job that cannot start is
skipped (best-effort FIFO). A job starts when its tenant's quota admits it and the policy
finds it a node. Otherwise it may preempt: jobs of tenants of its cohort that are
borrowing, when it is itself within its nominal quota (reclaim), and its own tenant's
lower-priority jobs. See docs/scheduler.md, "Tenants, preemption and failures". Pure.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import replace

from gateway.scheduler.cluster import GPU_MILLI, Node, Placement, Pod
from gateway.scheduler.queueing.failures import FailureSource
from gateway.scheduler.queueing.jobs import Job
from gateway.scheduler.queueing.preemptor import PreemptingState
from gateway.scheduler.queueing.releases import PodShape, pod_shape
from gateway.scheduler.queueing.report import report
from gateway.scheduler.queueing.runs import (
    DONE,
    REJECTED,
    RUNNING,
    JobRun,
    QueueConfig,
    QueueResult,
)
from gateway.scheduler.queueing.state import ARRIVE, FAIL, FINISH, REPAIR
from gateway.scheduler.queueing.tenancy import QuotaTenant


class QueueSimulator(PreemptingState):
    """One replay. Build it, call `run()` once."""

    def run(self) -> QueueResult:
        """Replay the whole trace; returns the metrics."""
        for run in self.runs:
            self._push(run.job.arrival, ARRIVE, run.index)
        self.arrivals_left = len(self.runs)
        start = self.runs[0].job.arrival if self.runs else 0.0
        if self.failures is not None:
            for index in range(len(self.nodes)):
                self._push(self.failures.next_failure(start), FAIL, index)
        self._record(start)
        now = start
        while self.events and self._work_left():
            now = self.events[0][0]
            full = False
            arrived: list[int] = []
            while self.events and self.events[0][0] == now:
                _, kind, seq, subject = heapq.heappop(self.events)
                if kind == ARRIVE:
                    if self._arrive(subject, now):
                        arrived.append(subject)
                elif kind == FINISH:
                    full |= self._finish(subject, seq, now)
                elif kind == FAIL:
                    full |= self._fail(subject, now)
                elif kind == REPAIR:
                    full |= self._repair(subject, now)
                else:
                    self.wakes.discard(now)
                    full = True
            # Arrivals alone free nothing: only the new jobs can start.
            self._schedule(now, None if full else arrived)
            self._record(now)
        end = max((r.finished for r in self.runs if r.state == DONE), default=start)
        return report(self, start, end)

    def _work_left(self) -> bool:
        # Failures and repairs go on forever; they matter only while jobs are left. With
        # nothing running, nothing down and nothing to arrive, every queued job would have
        # started in the last pass (unrunnable jobs are rejected on arrival).
        return (
            self.running_count > 0
            or self.arrivals_left > 0
            or (self.pending_count > 0 and self.down_milli > 0)
        )

    def _arrive(self, index: int, now: float) -> bool:
        self.arrivals_left -= 1
        run = self.runs[index]
        if not self._runnable_ever(run.job):
            run.state = REJECTED
            return False
        self._enqueue(run, now)
        return True

    def _finish(self, index: int, seq: int, now: float) -> bool:
        run = self.runs[index]
        if run.state != RUNNING or run.version != seq:
            return False  # stopped since (preempted or failed): a stale event
        prog = self._stop(run, now)
        gpus = run.job.gpus
        self.totals.checkpoint_gpu_s += prog.overhead * gpus
        self.totals.useful_gpu_s += run.job.duration * gpus
        self.totals.add(run.job.tenant, "useful_gpu_s", run.job.duration * gpus)
        run.saved = run.job.duration
        run.state = DONE
        run.finished = now
        return True

    def _fail(self, index: int, now: float) -> bool:
        if self.down[index]:
            return False
        node = self.nodes[index]
        self.totals.node_failures += 1
        for job_index in sorted(self.node_jobs[index]):
            run = self.runs[job_index]
            prog = self._stop(run, now)
            gpus = run.job.gpus
            self.totals.lost_failure_gpu_s += prog.unsaved * gpus
            self.totals.add(run.job.tenant, "lost_gpu_s", prog.unsaved * gpus)
            self.totals.checkpoint_gpu_s += prog.overhead * gpus
            self.totals.jobs_killed += 1
            run.saved += prog.committed
            self._enqueue(run, now)
        # Cordon: the node is marked unhealthy and filled with a reservation, so that
        # every policy (including those that cache node states) sees it as full.
        node.healthy = False
        cordon = Placement(index, tuple(range(node.gpus)))
        self.cluster.place(self._cordon(node), cordon)
        self.policy.placed(self._cordon(node), cordon)
        self.dirty.add(index)
        self.down[index] = True
        self.down_milli += node.gpus * GPU_MILLI
        assert self.failures is not None
        self._push(now + self.failures.repair_s, REPAIR, index)
        return True

    def _repair(self, index: int, now: float) -> bool:
        node = self.nodes[index]
        cordon = Placement(index, tuple(range(node.gpus)))
        self.cluster.unplace(self._cordon(node), cordon)
        node.healthy = True
        self._released(self._cordon(node), cordon)
        self.releases.released(index)
        self.down[index] = False
        self.down_milli -= node.gpus * GPU_MILLI
        assert self.failures is not None
        self._push(self.failures.next_failure(now), FAIL, index)
        return True

    @staticmethod
    def _cordon(node: Node) -> Pod:
        return Pod(f"cordon-{node.name}", node.gpus, GPU_MILLI, node.cpu_milli, node.memory_mib)

    def _schedule(self, now: float, only: list[int] | None) -> None:
        if only is None:
            queues = {t: [i for _, i in q] for t, q in self.pending.items() if q}
        else:
            queues = {}
            for index in only:
                queues.setdefault(self.runs[index].job.tenant, []).append(index)
        if not queues:
            return
        cursor = dict.fromkeys(queues, 0)
        heap = [(self.quotas.share(t), t) for t in queues]
        heapq.heapify(heap)
        started: set[int] = set()
        no_fit: set[PodShape] = set()
        blocked: set[tuple[str, int, PodShape, bool]] = set()
        while heap:
            share, tenant = heapq.heappop(heap)
            current = self.quotas.share(tenant)
            if current != share:
                heapq.heappush(heap, (current, tenant))
                continue
            queue = queues[tenant]
            index = queue[cursor[tenant]]
            cursor[tenant] += 1
            if self._try_start(self.runs[index], now, no_fit, blocked):
                started.add(index)
            if cursor[tenant] < len(queue):
                heapq.heappush(heap, (self.quotas.share(tenant), tenant))
        if started:
            for tenant in queues:
                self.pending[tenant] = [e for e in self.pending[tenant] if e[1] not in started]
            self.pending_count -= len(started)
        if self._requeue:
            # Victims queue again after the pass; another pass at this instant lets them
            # start elsewhere if there is room.
            for index in self._requeue:
                self._enqueue(self.runs[index], now)
            self._requeue.clear()
            self._wake(now)

    def _runnable_ever(self, job: Job) -> bool:
        """Whether the job could run on the empty cluster within its tenant's ceiling."""
        key = (job.tenant, pod_shape(job.pod))
        known = self._ever.get(key)
        if known is None:
            caps = self.quotas.tenants[job.tenant].model_caps_milli
            pod = job.pod
            if caps and job.gpu_milli:
                models = pod.gpu_models or self.models
                allowed = frozenset(
                    m for m in models if caps.get(m, job.gpu_milli) >= job.gpu_milli
                )
                pod = replace(pod, gpu_models=allowed)
                fits = bool(allowed) and self.releases.ever_fits(pod)
            else:
                fits = self.releases.ever_fits(pod)
            known = fits and job.gpu_milli <= self.quotas.ceiling(job.tenant)
            self._ever[key] = known
        return known

    def _try_start(
        self,
        run: JobRun,
        now: float,
        no_fit: set[PodShape],
        blocked: set[tuple[str, int, PodShape, bool]],
    ) -> bool:
        job = run.job
        # Within a pass resources only shrink (preemption leftovers get a pass of their
        # own), so a job like one that could neither start nor preempt cannot either.
        key = (
            job.tenant,
            job.priority,
            run.shape,
            self.quotas.within_nominal(job.tenant, job.gpu_milli),
        )
        if key in blocked:
            return False
        pod = self._allowed_pod(job)
        placeable: bool | None = None  # unknown until the policy is asked
        if pod is not None and self.quotas.admissible(job.tenant, job.gpu_milli):
            placement = self._place(pod, no_fit)
            if placement is not None:
                self._start(run, pod, placement, now, 0.0)
                return True
            placeable = False
        if self._preempt_for(run, key, now, placeable, no_fit):
            return True
        blocked.add(key)
        return False


def run_queue(
    nodes: Sequence[Node],
    jobs: Sequence[Job],
    tenants: Sequence[QuotaTenant],
    config: QueueConfig,
    failures: FailureSource | None = None,
) -> QueueResult:
    """Replay `jobs` on (empty copies of) `nodes` with `tenants`' quotas. `failures`
    replaces the seeded exponential model that `config.fail_mtbf_s` asks for."""
    return QueueSimulator(nodes, jobs, tenants, config, failures).run()
