"""The queueing replay's state and its bookkeeping: starting and stopping jobs (cluster,
quotas, policy caches, release log), the queue, placement with retry caching, and the
timeline. The event loop is `queue_sim.py`, preemption `queue_preempt.py`. Pure.
"""

from __future__ import annotations

import heapq
import random
from bisect import insort
from collections.abc import Sequence
from dataclasses import replace

from gateway.scheduler.cluster import Cluster, Node, Placement, Pod
from gateway.scheduler.fragmentation import Fragmentation, target_workload
from gateway.scheduler.policies.registry import make_policy
from gateway.scheduler.queueing.checkpoint import Progress, progress, run_length
from gateway.scheduler.queueing.failures import FailureModel, FailureSource
from gateway.scheduler.queueing.jobs import Job
from gateway.scheduler.queueing.measures import Timeline
from gateway.scheduler.queueing.releases import PodShape, ReleaseLog, pod_shape
from gateway.scheduler.queueing.runs import (
    PENDING,
    RUNNING,
    JobRun,
    Preemption,
    QueueConfig,
    Stuck,
    Totals,
    checkpoint_interval,
)
from gateway.scheduler.queueing.tenancy import Quotas, QuotaTenant

# Event kinds, in the order they are handled within one instant: releases first.
FINISH, REPAIR, FAIL, ARRIVE, WAKE = range(5)
_NO_POD = Pod("refresh", 0, 0, 0, 0)  # what `_refresh` hands the policy's `placed`


class QueueState:
    """Everything a replay tracks, and the operations that keep it consistent."""

    def __init__(
        self,
        nodes: Sequence[Node],
        jobs: Sequence[Job],
        tenants: Sequence[QuotaTenant],
        config: QueueConfig,
        failures: FailureSource | None = None,
    ) -> None:
        self.config = config
        self.cluster = Cluster([node.emptied() for node in nodes])
        self.nodes = self.cluster.nodes
        self.quotas = Quotas(tenants)
        unknown = {job.tenant for job in jobs} - set(self.quotas.tenants)
        if unknown:
            raise ValueError(f"jobs of tenants without a quota: {', '.join(sorted(unknown))}")
        shapes = target_workload([job.pod for job in jobs])
        self.policy = make_policy(config.policy, config.seed, shapes)
        self.policy.bind(self.cluster)
        self.measure = Fragmentation(shapes)
        self.node_frag = [self.measure.of_node(node) for node in self.nodes]
        self.models = frozenset(node.gpu_model for node in self.nodes)
        self.priorities = sorted({job.priority for job in jobs})
        self.runs = [
            JobRun(
                i,
                job,
                checkpoint_interval(job, config.checkpoint_rule, config.fail_mtbf_s),
                shape=pod_shape(job.pod),
            )
            for i, job in enumerate(sorted(jobs, key=lambda j: (j.arrival, j.name)))
        ]
        self.failures: FailureSource | None = failures
        if failures is None and config.fail_mtbf_s is not None:
            self.failures = FailureModel(
                config.fail_mtbf_s, config.repair_s, random.Random(config.seed)
            )
        self.events: list[tuple[float, int, int, int]] = []  # (time, kind, seq, subject)
        self._seq = 0
        self.pending: dict[str, list[tuple[tuple[int, float, int], int]]] = {
            t: [] for t in self.quotas.tenants
        }
        self.pending_count = 0
        self.running: dict[tuple[str, int], dict[int, None]] = {}  # start order per queue
        self.running_count = 0
        self.node_jobs: list[set[int]] = [set() for _ in self.nodes]
        self.down = [False] * len(self.nodes)
        self.down_milli = 0
        self.allocated_milli = 0  # by jobs; cordons excluded
        self.arrivals_left = 0
        self.wakes: set[float] = set()
        self.dirty: set[int] = set()
        self.totals = Totals()
        self.timeline = Timeline()
        self._requeue: list[int] = []
        self.preemption_log: list[Preemption] = []
        self._ever: dict[tuple[str, PodShape], bool] = {}
        self.releases = ReleaseLog(self.nodes)
        # Retry bookkeeping across passes (see releases.py): shapes no node took, with the
        # release-log mark they were last checked at; preemption searches that failed.
        self._unfit: dict[PodShape, int] = {}
        self._stuck: dict[tuple[str, int, PodShape, bool], Stuck] = {}
        self._cohort_releases = dict.fromkeys(self.quotas.members, 0)
        self._group_milli: dict[tuple[str, int], int] = {}  # running GPU per (tenant, priority)

    def _push(self, time: float, kind: int, subject: int) -> None:
        self._seq += 1
        heapq.heappush(self.events, (time, kind, self._seq, subject))

    def _enqueue(self, run: JobRun, now: float) -> None:
        run.state = PENDING
        run.ready_at = now
        entry = ((-run.job.priority, now, run.index), run.index)
        queue = self.pending[run.job.tenant]
        if queue and entry < queue[-1]:
            # Requeued jobs keep priority order; arrivals mostly append.
            insort(queue, entry)
        else:
            queue.append(entry)
        self.pending_count += 1

    def _refresh(self, index: int) -> None:
        # Policies refresh a node's cached state from the node itself in `placed`; with a
        # pod that takes nothing the call only does that, whatever changed on the node.
        self.policy.placed(_NO_POD, Placement(index, ()))
        self.dirty.add(index)

    def _released(self, pod: Pod, placement: Placement) -> None:
        # Policies that keep more than node states (a node held by a large job) learn of
        # a removal through `released`; the others only need their node cache refreshed.
        released = getattr(self.policy, "released", None)
        if released is None:
            self._refresh(placement.node)
        else:
            released(pod, placement)
            self.dirty.add(placement.node)

    def _start(self, run: JobRun, pod: Pod, placement: Placement, now: float, delay: float) -> None:
        job = run.job
        self.cluster.place(pod, placement)
        self.policy.placed(pod, placement)
        self.dirty.add(placement.node)
        run.model = self.nodes[placement.node].gpu_model
        run.placement = placement
        self.quotas.charge(job.tenant, run.model, job.gpu_milli)
        self.allocated_milli += job.gpu_milli
        self.node_jobs[placement.node].add(run.index)
        group = (job.tenant, job.priority)
        self.running.setdefault(group, {})[run.index] = None
        self._group_milli[group] = self._group_milli.get(group, 0) + job.gpu_milli
        self.running_count += 1
        run.state = RUNNING
        run.run_start = now
        run.work_start = now + delay
        run.waited += run.work_start - run.ready_at
        left = job.duration - run.saved
        self._seq += 1
        run.version = self._seq
        heapq.heappush(
            self.events,
            (
                run.work_start + run_length(left, run.interval, job.checkpoint_cost),
                FINISH,
                self._seq,
                run.index,
            ),
        )

    def _take(self, run: JobRun) -> None:
        """Give back a running job's resources (the first half of a stop; trials undo it)."""
        assert run.placement is not None
        self.cluster.unplace(run.job.pod, run.placement)
        self.quotas.release(run.job.tenant, run.model, run.job.gpu_milli)
        self.allocated_milli -= run.job.gpu_milli

    def _give_back(self, run: JobRun) -> None:
        assert run.placement is not None
        self.cluster.place(run.job.pod, run.placement)
        self.quotas.charge(run.job.tenant, run.model, run.job.gpu_milli)
        self.allocated_milli += run.job.gpu_milli

    def _forget(self, run: JobRun, now: float) -> Progress:
        """The second half of a stop: bookkeeping; returns how far the run got."""
        assert run.placement is not None
        node = run.placement.node
        self._released(run.job.pod, run.placement)
        self.node_jobs[node].discard(run.index)
        group = (run.job.tenant, run.job.priority)
        del self.running[group][run.index]
        self._group_milli[group] -= run.job.gpu_milli
        self.releases.released(node)
        self._cohort_releases[self.quotas.cohort_of(run.job.tenant)] += 1
        self.running_count -= 1
        run.placement = None
        run.version = 0
        if now < run.work_start:
            run.waited -= run.work_start - now  # stopped before its work began
        job = run.job
        return progress(
            now - run.work_start, job.duration - run.saved, run.interval, job.checkpoint_cost
        )

    def _stop(self, run: JobRun, now: float) -> Progress:
        self._take(run)
        return self._forget(run, now)

    def _wake(self, time: float) -> None:
        if time not in self.wakes:
            self.wakes.add(time)
            self._push(time, WAKE, -1)

    def _allowed_pod(self, job: Job) -> Pod | None:
        """The job's pod restricted to the GPU models its tenant's caps still leave room on
        (None: none left)."""
        caps = self.quotas.tenants[job.tenant].model_caps_milli
        if not caps or job.gpu_milli == 0:
            return job.pod
        models = job.pod.gpu_models or self.models
        allowed = frozenset(
            m for m in models if self.quotas.model_allowed(job.tenant, m, job.gpu_milli)
        )
        if not allowed:
            return None
        return job.pod if allowed == models else replace(job.pod, gpu_models=allowed)

    def _place(self, pod: Pod, no_fit: set[PodShape]) -> Placement | None:
        """The policy's placement for `pod`, unless this shape found no node before and
        fits none of the nodes released on since (asking the policy costs a pass over
        all nodes; this, one check per released node)."""
        shape = pod_shape(pod)
        if shape in no_fit:
            return None
        mark = self._unfit.get(shape)
        if mark is not None and not self.releases.fits_released(mark, pod, self.nodes):
            self._unfit[shape] = self.releases.mark
            no_fit.add(shape)
            return None
        placement = self.policy.choose(pod)
        if placement is None:
            self._unfit[shape] = self.releases.mark
            no_fit.add(shape)
        else:
            self._unfit.pop(shape, None)
        return placement

    def _record(self, now: float) -> None:
        for index in self.dirty:
            self.node_frag[index] = self.measure.of_node(self.nodes[index])
        self.dirty.clear()
        capacity = self.cluster.capacity_milli or 1
        self.timeline.record(
            now,
            (
                100.0 * self.allocated_milli / capacity,
                100.0 * sum(self.node_frag) / capacity,
                100.0 * self.down_milli / capacity,
                float(self.pending_count),
            ),
        )
