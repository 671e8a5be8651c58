"""The queueing replay's types: its configuration, a job's life, counters and the result. Pure."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from gateway.scheduler.cluster import Placement
from gateway.scheduler.queueing.checkpoint import daly_interval, young_interval
from gateway.scheduler.queueing.failures import HOUR
from gateway.scheduler.queueing.jobs import Job
from gateway.scheduler.queueing.releases import PodShape

ON_PREEMPT = ("auto", "checkpoint", "discard")
CHECKPOINT_RULES = ("trace", "young", "daly")
PENDING, RUNNING, DONE, REJECTED = range(4)  # a job's states


@dataclass(frozen=True, slots=True)
class QueueConfig:
    """How to replay: placement policy by name, seed (policy and failures), failures
    (`fail_mtbf_s` per node, None: no failures), what a preemption does with unsaved work
    (`auto`: checkpoint when that costs less time than the work it would lose), and where
    checkpoint intervals come from (`trace`, or Young's or Daly's optimum for the MTBF)."""

    policy: str = "fgd"
    seed: int = 0
    fail_mtbf_s: float | None = None
    repair_s: float = 4 * HOUR
    on_preempt: str = "auto"
    checkpoint_rule: str = "trace"
    series_points: int = 200
    retry_s: float = 10.0  # a failed preemption search waits this long before another

    def __post_init__(self) -> None:
        if self.on_preempt not in ON_PREEMPT:
            raise ValueError(f"on_preempt must be one of {', '.join(ON_PREEMPT)}")
        if self.checkpoint_rule not in CHECKPOINT_RULES:
            raise ValueError(f"checkpoint_rule must be one of {', '.join(CHECKPOINT_RULES)}")
        if self.checkpoint_rule != "trace" and self.fail_mtbf_s is None:
            raise ValueError(f"checkpoint_rule {self.checkpoint_rule} needs an MTBF")


def checkpoint_interval(job: Job, rule: str, mtbf_s: float | None) -> float:
    """The work between a job's checkpoints: the trace's, or the optimum for its checkpoint
    cost and the MTBF of the node it runs on (a job runs on one node). A job with no
    checkpoint cost keeps the trace's interval: the optimum would be zero."""
    if rule == "trace" or mtbf_s is None or job.checkpoint_cost <= 0:
        return job.checkpoint_interval
    if rule == "young":
        return young_interval(job.checkpoint_cost, mtbf_s)
    return daly_interval(job.checkpoint_cost, mtbf_s)


@dataclass(slots=True, eq=False)
class JobRun:
    """A job's life in the replay (mutable)."""

    index: int
    job: Job
    interval: float
    state: int = PENDING
    saved: float = 0.0  # work kept by checkpoints (seconds)
    ready_at: float = 0.0  # when it last joined the queue
    waited: float = 0.0  # seconds queued, all waits added up
    run_start: float = 0.0  # when it last took its resources
    work_start: float = 0.0  # when its work resumed (later when victims checkpoint first)
    placement: Placement | None = None
    model: str = ""
    version: int = 0  # bumped on each stop, so a stale completion event is ignored
    preempted: int = 0
    finished: float = math.nan
    shape: PodShape = (0, 0, 0, 0, frozenset())


@dataclass(slots=True)
class Stuck:
    """A failed preemption search and what it depended on (see
    `PreemptingState._still_stuck`)."""

    until: float  # no new search before this time (backoff)
    mark: int  # release-log position
    cohort_mark: int  # cohort releases then, or -1 when the quota was not what was short
    borrowing: tuple[bool, ...]  # which cohort tenants were borrowing
    young_until: float = math.inf  # when the first too-young candidate comes of age


@dataclass(slots=True)
class Totals:
    """Counters accumulated over a replay (GPU-seconds and events)."""

    useful_gpu_s: float = 0.0
    lost_preempt_gpu_s: float = 0.0
    lost_failure_gpu_s: float = 0.0
    checkpoint_gpu_s: float = 0.0
    preemptions_reclaim: int = 0
    preemptions_priority: int = 0
    checkpointed_preemptions: int = 0
    node_failures: int = 0
    jobs_killed: int = 0
    by_tenant: dict[str, dict[str, float]] = field(default_factory=dict)

    def add(self, tenant: str, key: str, amount: float) -> None:
        """Add to a per-tenant counter."""
        counters = self.by_tenant.setdefault(tenant, {})
        counters[key] = counters.get(key, 0.0) + amount


@dataclass(frozen=True, slots=True)
class Preemption:
    """One victim: when, who, for whom, why (`reclaim` or `priority`), and whether its
    unsaved work was checkpointed."""

    time: float
    victim: str
    preemptor: str
    reason: str
    checkpointed: bool


@dataclass(slots=True)
class QueueResult:
    """The replay's outcome: the metrics document, the raw queueing times, each job's
    final state and the preemptions in order."""

    metrics: dict[str, Any]
    waits_by_tenant: dict[str, list[float]]
    waits_by_priority: dict[int, list[float]]
    runs: list[JobRun]
    preemptions: list[Preemption]
