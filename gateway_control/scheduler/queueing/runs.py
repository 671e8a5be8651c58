"""A job's life in the queueing replay, the replay's counters and its result. Pure."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from gateway_control.scheduler.cluster import Placement
from gateway_control.scheduler.queueing.jobs import Job
from gateway_control.scheduler.queueing.releases import PodShape

PENDING, RUNNING, DONE, REJECTED = range(4)  # a job's states


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
