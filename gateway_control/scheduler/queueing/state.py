"""The queueing replay's cluster-side state and the operations that keep it consistent:
starting and stopping jobs (cluster, quotas, policy caches, release log), placement with
retry caching, and cordoning failed nodes. The event loop is `simulator.py`, the victim
search `preemptor.py`. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gateway_control.scheduler.cluster import GPU_MILLI, Cluster, Node, Placement, Pod
from gateway_control.scheduler.fragmentation import target_workload
from gateway_control.scheduler.policies.registry import make_policy
from gateway_control.scheduler.queueing.checkpoint import Progress, progress, run_length
from gateway_control.scheduler.queueing.events import FINISH, EventQueue
from gateway_control.scheduler.queueing.jobs import Job
from gateway_control.scheduler.queueing.queue_config import QueueConfig, checkpoint_interval
from gateway_control.scheduler.queueing.releases import PodShape, ReleaseLog, pod_shape
from gateway_control.scheduler.queueing.runs import RUNNING, JobRun, Totals
from gateway_control.scheduler.queueing.tenancy import Quotas, QuotaTenant

_NO_POD = Pod("refresh", 0, 0, 0, 0)  # what `refresh` hands the policy's `placed`


def cordon_pod(node: Node) -> Pod:
    """The reservation that fills a failed node, so every policy sees it as full."""
    return Pod(f"cordon-{node.name}", node.gpus, GPU_MILLI, node.cpu_milli, node.memory_mib)


class QueueState:
    """The cluster, the quotas, the policy and the runs of one replay; its event queue
    (starting a job schedules its finish); what runs where; the counters."""

    def __init__(
        self,
        nodes: Sequence[Node],
        jobs: Sequence[Job],
        tenants: Sequence[QuotaTenant],
        config: QueueConfig,
    ) -> None:
        self.config = config
        self.cluster = Cluster([node.emptied() for node in nodes])
        self.nodes = self.cluster.nodes
        self.quotas = Quotas(tenants)
        unknown = {job.tenant for job in jobs} - set(self.quotas.tenants)
        if unknown:
            raise ValueError(f"jobs of tenants without a quota: {', '.join(sorted(unknown))}")
        self.shapes = target_workload([job.pod for job in jobs])
        self.policy = make_policy(config.policy, config.seed, self.shapes)
        self.policy.bind(self.cluster)
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
        self.events = EventQueue()
        self.running: dict[tuple[str, int], dict[int, None]] = {}  # start order per queue
        self.running_count = 0
        self.node_jobs: list[set[int]] = [set() for _ in self.nodes]
        self.down = [False] * len(self.nodes)
        self.down_milli = 0
        self.allocated_milli = 0  # by jobs; cordons excluded
        self.totals = Totals()
        self.releases = ReleaseLog(self.nodes)
        # Releases per cohort, and running GPU per (tenant, priority): what a failed
        # preemption search depends on.
        self.cohort_releases = dict.fromkeys(self.quotas.members, 0)
        self.group_milli: dict[tuple[str, int], int] = {}
        self._dirty: set[int] = set()  # nodes changed since the last `drain_dirty`
        # Retry bookkeeping across passes (see releases.py): shapes no node took, with the
        # release-log mark they were last checked at.
        self._unfit: dict[PodShape, int] = {}

    def drain_dirty(self) -> set[int]:
        """The nodes changed since the last call."""
        dirty, self._dirty = self._dirty, set()
        return dirty

    def refresh(self, index: int) -> None:
        """Have the policy re-read node `index` (changed behind its back)."""
        # Policies refresh a node's cached state from the node itself in `placed`; with a
        # pod that takes nothing the call only does that, whatever changed on the node.
        self.policy.placed(_NO_POD, Placement(index, ()))
        self._dirty.add(index)

    def notify_released(self, pod: Pod, placement: Placement) -> None:
        """Tell the policy that the cluster took `placement` of `pod` back."""
        # Policies that keep more than node states (a node held by a large job) learn of
        # a removal through `released`; the others only need their node cache refreshed.
        released = getattr(self.policy, "released", None)
        if released is None:
            self.refresh(placement.node)
        else:
            released(pod, placement)
            self._dirty.add(placement.node)

    def start(self, run: JobRun, pod: Pod, placement: Placement, now: float, delay: float) -> None:
        """Run `run` (as `pod`, its job's pod possibly restricted to some models) where
        `placement` says from `now`; its work begins `delay` later."""
        job = run.job
        self.cluster.place(pod, placement)
        self.policy.placed(pod, placement)
        self._dirty.add(placement.node)
        run.model = self.nodes[placement.node].gpu_model
        run.placement = placement
        self.quotas.charge(job.tenant, run.model, job.gpu_milli)
        self.allocated_milli += job.gpu_milli
        self.node_jobs[placement.node].add(run.index)
        group = (job.tenant, job.priority)
        self.running.setdefault(group, {})[run.index] = None
        self.group_milli[group] = self.group_milli.get(group, 0) + job.gpu_milli
        self.running_count += 1
        run.state = RUNNING
        run.run_start = now
        run.work_start = now + delay
        run.waited += run.work_start - run.ready_at
        left = job.duration - run.saved
        finish = run.work_start + run_length(left, run.interval, job.checkpoint_cost)
        run.version = self.events.push(finish, FINISH, run.index)

    def take(self, run: JobRun) -> None:
        """Give back a running job's resources (the first half of a stop; trials undo it
        with `give_back`)."""
        assert run.placement is not None
        self.cluster.unplace(run.job.pod, run.placement)
        self.quotas.release(run.job.tenant, run.model, run.job.gpu_milli)
        self.allocated_milli -= run.job.gpu_milli

    def give_back(self, run: JobRun) -> None:
        """Undo `take`."""
        assert run.placement is not None
        self.cluster.place(run.job.pod, run.placement)
        self.quotas.charge(run.job.tenant, run.model, run.job.gpu_milli)
        self.allocated_milli += run.job.gpu_milli

    def forget(self, run: JobRun, now: float) -> Progress:
        """The second half of a stop: bookkeeping; returns how far the run got."""
        assert run.placement is not None
        node = run.placement.node
        self.notify_released(run.job.pod, run.placement)
        self.node_jobs[node].discard(run.index)
        group = (run.job.tenant, run.job.priority)
        del self.running[group][run.index]
        self.group_milli[group] -= run.job.gpu_milli
        self.releases.released(node)
        self.cohort_releases[self.quotas.cohort_of(run.job.tenant)] += 1
        self.running_count -= 1
        run.placement = None
        run.version = 0
        if now < run.work_start:
            run.waited -= run.work_start - now  # stopped before its work began
        job = run.job
        return progress(
            now - run.work_start, job.duration - run.saved, run.interval, job.checkpoint_cost
        )

    def stop(self, run: JobRun, now: float) -> Progress:
        """Stop a running job; returns how far it got."""
        self.take(run)
        return self.forget(run, now)

    def allowed_pod(self, job: Job) -> Pod | None:
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

    def place(self, pod: Pod, no_fit: set[PodShape]) -> Placement | None:
        """The policy's placement for `pod`, unless this shape found no node before and
        fits none of the nodes released on since (asking the policy costs a pass over
        all nodes; this, one check per released node). `no_fit`: the shapes that found
        no node in this pass (updated)."""
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

    def cordon(self, index: int) -> None:
        """Take failed node `index` out: marked unhealthy and filled with a reservation, so
        that every policy (including those that cache node states) sees it as full. Its
        jobs must have been stopped."""
        node = self.nodes[index]
        node.healthy = False
        cordon = Placement(index, tuple(range(node.gpus)))
        self.cluster.place(cordon_pod(node), cordon)
        self.policy.placed(cordon_pod(node), cordon)
        self._dirty.add(index)
        self.down[index] = True
        self.down_milli += node.gpus * GPU_MILLI

    def uncordon(self, index: int) -> None:
        """Put repaired node `index` back."""
        node = self.nodes[index]
        cordon = Placement(index, tuple(range(node.gpus)))
        self.cluster.unplace(cordon_pod(node), cordon)
        node.healthy = True
        self.notify_released(cordon_pod(node), cordon)
        self.releases.released(index)
        self.down[index] = False
        self.down_milli -= node.gpus * GPU_MILLI
