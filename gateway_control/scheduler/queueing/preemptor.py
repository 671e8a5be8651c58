"""Preemption in the queueing replay: candidates, the victim search, evicting victims.

A job that cannot start may preempt its own tenant's lower-priority jobs and, when it is
within its nominal quota, the jobs of the other tenants of its cohort that are borrowing
(reclaim). When no node fits it, the victims must free one node: the search picks the node
first (`_node_first`), then adds victims anywhere for the quota. Failed searches back off
(`QueueConfig.retry_s`) and are retried only when something they depend on changed. Pure.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from gateway_control.scheduler.queueing.jobs import Job
from gateway_control.scheduler.queueing.pending import PendingQueue
from gateway_control.scheduler.queueing.releases import PodShape
from gateway_control.scheduler.queueing.runs import PENDING, JobRun, Preemption
from gateway_control.scheduler.queueing.state import QueueState
from gateway_control.scheduler.queueing.victims import select_victims, victim_key

VictimKey = tuple[int, int, int]
StuckKey = tuple[str, int, PodShape, bool]  # tenant, priority, shape, within nominal quota


@dataclass(slots=True)
class Stuck:
    """A failed preemption search and what it depended on (see
    `Preemptor._still_stuck`)."""

    until: float  # no new search before this time (backoff)
    mark: int  # release-log position
    cohort_mark: int  # cohort releases then, or -1 when the quota was not what was short
    borrowing: tuple[bool, ...]  # which cohort tenants were borrowing
    young_until: float = math.inf  # when the first too-young candidate comes of age


class Preemptor:
    """Finds and evicts victims for jobs that cannot start, in one replay's state; victims
    go back to `pending` after the pass. `log`: the preemptions in order."""

    def __init__(self, state: QueueState, pending: PendingQueue) -> None:
        self._state = state
        self._pending = pending
        self._stuck: dict[StuckKey, Stuck] = {}
        self.log: list[Preemption] = []

    def _candidates(self, job: Job) -> list[Iterator[tuple[VictimKey, int]]]:
        """Streams of possible victims, each in victim order: the tenant's own
        lower-priority jobs, and when `job` is within its nominal quota (reclaim) the
        jobs of the other tenants of its cohort that are borrowing."""
        quotas = self._state.quotas
        reclaim = quotas.within_nominal(job.tenant, job.gpu_milli)
        streams = []
        for tenant in quotas.members[quotas.cohort_of(job.tenant)]:
            borrowing = quotas.is_borrowing(tenant)
            if tenant != job.tenant and not (reclaim and borrowing):
                continue
            for priority in self._state.priorities:
                if tenant == job.tenant and priority >= job.priority:
                    break
                jobs = self._state.running.get((tenant, priority))
                if jobs:
                    streams.append(self._stream(jobs, borrowing, priority))
        return streams

    def _stream(
        self, jobs: dict[int, None], borrowing: bool, priority: int
    ) -> Iterator[tuple[VictimKey, int]]:
        runs = self._state.runs
        for index in reversed(jobs):  # youngest first
            yield victim_key(borrowing, priority, runs[index].version), index

    def _quota_reachable(self, job: Job) -> bool:
        """Whether preempting every candidate could make room in the quotas (an upper
        bound: it ignores minimum runtimes and non-preemptible jobs)."""
        quotas = self._state.quotas
        tenant = quotas.tenants[job.tenant]
        own = sum(
            self._state.group_milli.get((job.tenant, p), 0)
            for p in self._state.priorities
            if p < job.priority
        )
        cohort = quotas.cohort_of(job.tenant)
        others = 0
        if quotas.within_nominal(job.tenant, job.gpu_milli):
            others = sum(
                quotas.usage[u]
                for u in quotas.members[cohort]
                if u != job.tenant and quotas.is_borrowing(u)
            )
        cohort_need = quotas.cohort_usage[cohort] + job.gpu_milli - quotas.cohort_nominal[cohort]
        if own + others < cohort_need:
            return False
        limit = tenant.borrowing_limit_milli
        return limit is None or own >= quotas.usage[job.tenant] + job.gpu_milli - (
            tenant.quota_milli + limit
        )

    def _borrowing(self, tenant: str) -> tuple[bool, ...]:
        quotas = self._state.quotas
        return tuple(quotas.is_borrowing(u) for u in quotas.members[quotas.cohort_of(tenant)])

    def _still_stuck(self, key: StuckKey, job: Job, now: float) -> bool:
        """Whether to skip the preemption search for a job like one whose search failed:
        during the backoff, and after it until something the search depends on changed
        (a candidate came of age, a cohort tenant started or stopped borrowing, something
        was released on a node that could host the job or, when the quota was short, in
        the cohort). Jobs starting never help: they only take resources."""
        stuck = self._stuck.get(key)
        if stuck is None:
            return False
        cohort = self._state.quotas.cohort_of(job.tenant)
        changed = (
            now >= stuck.young_until
            or stuck.borrowing != self._borrowing(job.tenant)
            or (stuck.cohort_mark >= 0 and stuck.cohort_mark != self._state.cohort_releases[cohort])
            or self._state.releases.released_since(stuck.mark, job.pod)
        )
        if now < stuck.until:
            if changed:
                self._state.events.wake(stuck.until)
            return True
        if not changed:
            stuck.mark = self._state.releases.mark
            return True
        del self._stuck[key]
        return False

    def preempt_for(
        self,
        run: JobRun,
        key: StuckKey,
        now: float,
        placeable: bool | None,
        no_fit: set[PodShape],
    ) -> bool:
        """Start `run` by preempting victims, if a set of them lets it run; whether it
        started. `key`: what jobs like it share (a failed search is not retried for them
        until something it depends on changed); `placeable`: whether the policy found it a
        node as things are (None: not asked, the quota blocked it); `no_fit`: the pass's
        shapes that found no node."""
        job = run.job
        streams = self._candidates(job)
        if not streams or self._still_stuck(key, job, now):
            return False
        quotas = self._state.quotas
        cohort = quotas.cohort_of(job.tenant)
        until = now + self._state.config.retry_s
        if not self._quota_reachable(job):
            self._stuck[key] = Stuck(
                until,
                self._state.releases.mark,
                self._state.cohort_releases[cohort],
                self._borrowing(job.tenant),
            )
            return False
        if placeable is None:
            # Quota-blocked: the policy has not been asked yet.
            pod = self._state.allowed_pod(job)
            placeable = pod is not None and self._state.place(pod, no_fit) is not None
        capped = bool(quotas.tenants[job.tenant].model_caps_milli)
        fit_nodes: set[int] = set()
        touched: set[int] = set()
        young_until = math.inf
        quota_short = True  # as of the last check: was the quota what was missing?

        def eligible(index: int) -> bool:
            nonlocal young_until
            victim = self._state.runs[index]
            vjob = victim.job
            if not vjob.preemptible:
                return False
            of_age = victim.run_start + vjob.min_runtime
            if of_age > now:
                young_until = min(young_until, of_age)
                return False
            return vjob.tenant == job.tenant or quotas.is_borrowing(vjob.tenant)

        def fits(node: int) -> bool:
            pod = self._state.allowed_pod(job)
            return pod is not None and pod.fits(self._state.nodes[node])

        def take(index: int) -> None:
            victim = self._state.runs[index]
            self._state.take(victim)
            assert victim.placement is not None
            node = victim.placement.node
            touched.add(node)
            if not placeable and fits(node):
                fit_nodes.add(node)

        def give_back(index: int) -> None:
            victim = self._state.runs[index]
            self._state.give_back(victim)
            assert victim.placement is not None
            node = victim.placement.node
            if node in fit_nodes and not fits(node):
                fit_nodes.discard(node)

        def satisfied() -> bool:
            nonlocal quota_short
            quota_short = not quotas.admissible(job.tenant, job.gpu_milli)
            if quota_short or self._state.allowed_pod(job) is None:
                return False
            if placeable:
                return True
            if capped:
                # A cap can close a model again when own victims are given back.
                return any(fits(node) for node in fit_nodes)
            return bool(fit_nodes)

        merged = heapq.merge(*streams)
        order: Iterable[int]
        if placeable:
            order = (index for _, index in merged)  # only the quota is short
        else:
            order = self._node_first(job, merged, eligible)
        victims = select_victims(order, eligible, take, give_back, satisfied)
        if victims is None:
            # Every trial was undone: the nodes are as the policy last saw them.
            self._stuck[key] = Stuck(
                until,
                self._state.releases.mark,
                self._state.cohort_releases[cohort] if quota_short else -1,
                self._borrowing(job.tenant),
                young_until,
            )
            if young_until < math.inf:
                self._state.events.wake(max(young_until, until))
            return False
        delay = 0.0
        for index in victims:
            delay = max(delay, self._evict(self._state.runs[index], job, now))
        for node in touched:
            self._state.refresh(node)
        pod = self._state.allowed_pod(job)
        placement = None if pod is None else self._state.policy.choose(pod)
        if pod is None or placement is None:
            # Cannot happen while policies place on any node that fits; if one did not,
            # the victims are already gone and the job waits for the next pass.
            return False
        # The preemptor waits for the victims' checkpoints (it holds the GPU meanwhile).
        self._state.start(run, pod, placement, now, delay)
        return True

    def _node_first(
        self,
        job: Job,
        merged: Iterable[tuple[VictimKey, int]],
        eligible: Callable[[int], bool],
    ) -> list[int]:
        """Victim order when no node fits the job: first the victims on the one node where
        removing them makes it fit (the node whose least preferred needed victim is the
        most preferred, then the fewest victims, then the first node), then every other
        eligible candidate in victim order (for the quota). Empty when no node would do:
        victims on different nodes do not add up."""
        pod = self._state.allowed_pod(job) or job.pod
        hostable = self._state.releases.hostable(pod)
        ordered: list[int] = []
        keys: dict[int, VictimKey] = {}
        by_node: dict[int, list[int]] = {}
        for key, index in merged:
            if not eligible(index):
                continue
            ordered.append(index)
            keys[index] = key
            placement = self._state.runs[index].placement
            assert placement is not None
            if hostable[placement.node] and not self._state.down[placement.node]:
                by_node.setdefault(placement.node, []).append(index)
        best: tuple[VictimKey, int, int] | None = None
        best_victims: list[int] = []
        for node_index, candidates in by_node.items():
            node = self._state.nodes[node_index]
            taken: list[int] = []
            for index in candidates:  # in victim order
                victim = self._state.runs[index]
                assert victim.placement is not None
                node.unplace(victim.job.pod, victim.placement.gpus)
                taken.append(index)
                if pod.fits(node):
                    break
            fits = pod.fits(node)
            for index in reversed(taken):
                victim = self._state.runs[index]
                assert victim.placement is not None
                node.place(victim.job.pod, victim.placement.gpus)
            if fits:
                rank = (keys[taken[-1]], len(taken), node_index)
                if best is None or rank < best:
                    best, best_victims = rank, taken
        if best is None:
            return []
        chosen = set(best_victims)
        return best_victims + [index for index in ordered if index not in chosen]

    def _evict(self, victim: JobRun, preemptor: Job, now: float) -> float:
        """Finish a victim's stop: checkpoint or drop its unsaved work; returns the
        checkpoint time the preemptor waits for."""
        prog = self._state.forget(victim, now)
        job = victim.job
        gpus = job.gpus
        cost = prog.writing_left if prog.writing_left > 0 else job.checkpoint_cost
        mode = self._state.config.on_preempt
        save = prog.unsaved > 0 and (
            mode == "checkpoint" or (mode == "auto" and cost < prog.unsaved)
        )
        self._state.totals.checkpoint_gpu_s += prog.overhead * gpus
        delay = 0.0
        if save:
            victim.saved += prog.done
            self._state.totals.checkpoint_gpu_s += cost * gpus
            self._state.totals.checkpointed_preemptions += 1
            delay = cost
        else:
            victim.saved += prog.committed
            self._state.totals.lost_preempt_gpu_s += prog.unsaved * gpus
            self._state.totals.add(job.tenant, "lost_gpu_s", prog.unsaved * gpus)
        reason = "priority" if job.tenant == preemptor.tenant else "reclaim"
        if reason == "priority":
            self._state.totals.preemptions_priority += 1
        else:
            self._state.totals.preemptions_reclaim += 1
        self.log.append(Preemption(now, job.name, preemptor.name, reason, save))
        self._state.totals.add(job.tenant, "preemptions", 1)
        victim.preempted += 1
        victim.state = PENDING
        self._pending.defer(victim.index)
        return delay
