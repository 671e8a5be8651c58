"""Discrete-event replay of a job trace: placement, quotas, fair share, preemption, failures.

Events are arrivals, completions, node failures and repairs; after each instant's events
one scheduling pass runs. A pass goes through the pending jobs tenant by tenant, always
taking the next job of the tenant with the lowest fair share (borrowed GPU per weight),
each tenant's jobs by priority then by when they were queued; a job that cannot start is
skipped (best-effort FIFO). A job starts when its tenant's quota admits it and the policy
finds it a node. Otherwise it may preempt: jobs of tenants of its cohort that are
borrowing, when it is itself within its nominal quota (reclaim), and its own tenant's
lower-priority jobs. See docs/scheduler.md, "Tenants, preemption and failures". Pure.

The simulator holds the parts: the state (cluster, quotas, policy, runs, events), the
pending queue, the preemptor, the recorder (timeline) and the failure source.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Sequence
from dataclasses import replace

from gateway_control.scheduler.cluster import Node
from gateway_control.scheduler.queueing.events import ARRIVE, FAIL, FINISH, REPAIR
from gateway_control.scheduler.queueing.failures import FailureModel, FailureSource
from gateway_control.scheduler.queueing.jobs import Job
from gateway_control.scheduler.queueing.pending import PendingQueue
from gateway_control.scheduler.queueing.preemptor import Preemptor, StuckKey
from gateway_control.scheduler.queueing.queue_config import QueueConfig
from gateway_control.scheduler.queueing.recorder import Recorder
from gateway_control.scheduler.queueing.releases import PodShape, pod_shape
from gateway_control.scheduler.queueing.report import report
from gateway_control.scheduler.queueing.runs import DONE, REJECTED, RUNNING, JobRun, QueueResult
from gateway_control.scheduler.queueing.state import QueueState
from gateway_control.scheduler.queueing.tenancy import QuotaTenant


class QueueSimulator:
    """One replay of `state` (fresh: nothing started). Build it, call `run()` once.
    `failures` replaces the seeded exponential model that `config.fail_mtbf_s` asks for."""

    def __init__(self, state: QueueState, failures: FailureSource | None = None) -> None:
        config = state.config
        self.state = state
        self.events = state.events
        self.pending = PendingQueue(state.quotas.tenants)
        self.preemptor = Preemptor(state, self.pending)
        self.recorder = Recorder(state.nodes, state.shapes)
        self.failures: FailureSource | None = failures
        if failures is None and config.fail_mtbf_s is not None:
            self.failures = FailureModel(
                config.fail_mtbf_s, config.repair_s, random.Random(config.seed)
            )
        self._arrivals_left = 0
        self._ever: dict[tuple[str, PodShape], bool] = {}  # see `_runnable_ever`

    def run(self) -> QueueResult:
        """Replay the whole trace; returns the metrics."""
        state, events = self.state, self.events
        for run in state.runs:
            events.push(run.job.arrival, ARRIVE, run.index)
        self._arrivals_left = len(state.runs)
        start = state.runs[0].job.arrival if state.runs else 0.0
        if self.failures is not None:
            for index in range(len(state.nodes)):
                events.push(self.failures.next_failure(start), FAIL, index)
        self._record(start)
        now = start
        while events and self._work_left():
            now = events.next_time()
            full = False
            arrived: list[int] = []
            while events and events.next_time() == now:
                _, kind, seq, subject = events.pop()
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
                    events.woke(now)
                    full = True
            # Arrivals alone free nothing: only the new jobs can start.
            self._schedule(now, None if full else arrived)
            self._record(now)
        end = max((r.finished for r in state.runs if r.state == DONE), default=start)
        return report(state, self.recorder.timeline, self.preemptor.log, start, end)

    def _record(self, now: float) -> None:
        state = self.state
        self.recorder.record(
            now,
            state.drain_dirty(),
            state.cluster.capacity_milli,
            state.allocated_milli,
            state.down_milli,
            self.pending.count,
        )

    def _work_left(self) -> bool:
        # Failures and repairs go on forever; they matter only while jobs are left. With
        # nothing running, nothing down and nothing to arrive, every queued job would have
        # started in the last pass (unrunnable jobs are rejected on arrival).
        return (
            self.state.running_count > 0
            or self._arrivals_left > 0
            or (self.pending.count > 0 and self.state.down_milli > 0)
        )

    def _arrive(self, index: int, now: float) -> bool:
        self._arrivals_left -= 1
        run = self.state.runs[index]
        if not self._runnable_ever(run.job):
            run.state = REJECTED
            return False
        self.pending.enqueue(run, now)
        return True

    def _finish(self, index: int, seq: int, now: float) -> bool:
        run = self.state.runs[index]
        if run.state != RUNNING or run.version != seq:
            return False  # stopped since (preempted or failed): a stale event
        totals = self.state.totals
        prog = self.state.stop(run, now)
        gpus = run.job.gpus
        totals.checkpoint_gpu_s += prog.overhead * gpus
        totals.useful_gpu_s += run.job.duration * gpus
        totals.add(run.job.tenant, "useful_gpu_s", run.job.duration * gpus)
        run.saved = run.job.duration
        run.state = DONE
        run.finished = now
        return True

    def _fail(self, index: int, now: float) -> bool:
        state = self.state
        if state.down[index]:
            return False
        totals = state.totals
        totals.node_failures += 1
        for job_index in sorted(state.node_jobs[index]):
            run = state.runs[job_index]
            prog = state.stop(run, now)
            gpus = run.job.gpus
            totals.lost_failure_gpu_s += prog.unsaved * gpus
            totals.add(run.job.tenant, "lost_gpu_s", prog.unsaved * gpus)
            totals.checkpoint_gpu_s += prog.overhead * gpus
            totals.jobs_killed += 1
            run.saved += prog.committed
            self.pending.enqueue(run, now)
        state.cordon(index)
        assert self.failures is not None
        self.events.push(now + self.failures.repair_s, REPAIR, index)
        return True

    def _repair(self, index: int, now: float) -> bool:
        self.state.uncordon(index)
        assert self.failures is not None
        self.events.push(self.failures.next_failure(now), FAIL, index)
        return True

    def _schedule(self, now: float, only: list[int] | None) -> None:
        state = self.state
        quotas = state.quotas
        if only is None:
            queues = self.pending.waiting()
        else:
            queues = {}
            for index in only:
                queues.setdefault(state.runs[index].job.tenant, []).append(index)
        if not queues:
            return
        cursor = dict.fromkeys(queues, 0)
        heap = [(quotas.share(t), t) for t in queues]
        heapq.heapify(heap)
        started: set[int] = set()
        no_fit: set[PodShape] = set()
        blocked: set[StuckKey] = set()
        while heap:
            share, tenant = heapq.heappop(heap)
            current = quotas.share(tenant)
            if current != share:
                heapq.heappush(heap, (current, tenant))
                continue
            queue = queues[tenant]
            index = queue[cursor[tenant]]
            cursor[tenant] += 1
            if self._try_start(state.runs[index], now, no_fit, blocked):
                started.add(index)
            if cursor[tenant] < len(queue):
                heapq.heappush(heap, (quotas.share(tenant), tenant))
        if started:
            self.pending.remove(started, queues)
        # Victims queue again after the pass; another pass at this instant lets them
        # start elsewhere if there is room.
        if self.pending.requeue_deferred(state.runs, now):
            self.events.wake(now)

    def _runnable_ever(self, job: Job) -> bool:
        """Whether the job could run on the empty cluster within its tenant's ceiling."""
        state = self.state
        key = (job.tenant, pod_shape(job.pod))
        known = self._ever.get(key)
        if known is None:
            caps = state.quotas.tenants[job.tenant].model_caps_milli
            pod = job.pod
            if caps and job.gpu_milli:
                models = pod.gpu_models or state.models
                allowed = frozenset(
                    m for m in models if caps.get(m, job.gpu_milli) >= job.gpu_milli
                )
                pod = replace(pod, gpu_models=allowed)
                fits = bool(allowed) and state.releases.ever_fits(pod)
            else:
                fits = state.releases.ever_fits(pod)
            known = fits and job.gpu_milli <= state.quotas.ceiling(job.tenant)
            self._ever[key] = known
        return known

    def _try_start(
        self,
        run: JobRun,
        now: float,
        no_fit: set[PodShape],
        blocked: set[StuckKey],
    ) -> bool:
        state = self.state
        job = run.job
        # Within a pass resources only shrink (preemption leftovers get a pass of their
        # own), so a job like one that could neither start nor preempt cannot either.
        key = (
            job.tenant,
            job.priority,
            run.shape,
            state.quotas.within_nominal(job.tenant, job.gpu_milli),
        )
        if key in blocked:
            return False
        pod = state.allowed_pod(job)
        placeable: bool | None = None  # unknown until the policy is asked
        if pod is not None and state.quotas.admissible(job.tenant, job.gpu_milli):
            placement = state.place(pod, no_fit)
            if placement is not None:
                state.start(run, pod, placement, now, 0.0)
                return True
            placeable = False
        if self.preemptor.preempt_for(run, key, now, placeable, no_fit):
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
    return QueueSimulator(QueueState(nodes, jobs, tenants, config), failures).run()
