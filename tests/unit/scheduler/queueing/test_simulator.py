"""gateway_control.scheduler.queueing.simulator: fair share, cohorts, failures, rejection.

The golden cases are small enough to follow by hand; each states the timeline it expects."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest

from gateway_control.scheduler.queueing.queue_config import QueueConfig
from gateway_control.scheduler.queueing.simulator import run_queue
from gateway_control.scheduler.queueing.tenancy import QuotaTenant
from tests.unit.scheduler.queueing.replay_helpers import (
    G,
    by_name,
    job,
    node,
    pair,
    reclaim_trace,
    replay,
)


@dataclass
class ScriptedFailures:
    """Failure times in order of asking; afterwards never."""

    times: list[float]
    repair_s: float = 100.0
    asked: list[float] = field(default_factory=list)

    def next_failure(self, up_since: float) -> float:
        self.asked.append(up_since)
        return self.times.pop(0) if self.times else math.inf


def test_no_borrowing_without_cohort() -> None:
    # Same trace, each tenant alone: a may use only its 2 GPUs, so a3 and a4 wait.
    result = replay([node()], reclaim_trace(), pair(cohort=""))
    runs = by_name(result)
    assert not result.preemptions
    assert runs["a3"].waited == 1000 and runs["a4"].waited == 1000
    assert runs["b1"].waited == 0


def test_weighted_fair_share_orders_borrowers() -> None:
    # Cohort of 8 GPUs: a (nominal 2, weight 1), b (nominal 2, weight 2), c (nominal 4,
    # idle). a and b each submit 5 one-GPU jobs at t=0. Past their nominal quotas the
    # one with less borrowed GPU per weight goes first: b borrows 3 of c's 4, a 1.
    tenants = [
        QuotaTenant("a", 2 * G, "c"),
        QuotaTenant("b", 2 * G, "c", weight=2),
        QuotaTenant("c", 4 * G, "c"),
    ]
    jobs = [job(f"{t}{i}", t, duration=100) for t in "ab" for i in range(5)]
    result = replay([node("n0"), node("n1")], jobs, tenants)
    waits = {t: sorted(result.waits_by_tenant[t]) for t in "ab"}
    assert waits == {"a": [0, 0, 0, 100, 100], "b": [0, 0, 0, 0, 0]}
    assert not result.preemptions  # neither is within nominal when it wants more


def test_failure_requeues_from_last_checkpoint() -> None:
    # J: 1000 s of work, checkpoint every 200 s costing 10 s. The node fails at 650:
    # three checkpoints done (600 s saved), 20 s of work lost. Repaired at 750, J
    # resumes with 400 s (one checkpoint): 410 s, done at 1160.
    jobs = [job("J", interval=200, cost=10)]
    failures = ScriptedFailures([650.0])
    result = run_queue(
        [node(gpus=1)], jobs, [QuotaTenant("a", G)], QueueConfig(policy="best-fit"), failures
    )
    runs = by_name(result)
    m = result.metrics
    assert m["failures"] == {"node_failures": 1, "jobs_killed": 1}
    assert m["lost_gpu_s"] == {"total": 20, "preemption": 0, "failure": 20}
    assert m["checkpoint_gpu_s"] == 40  # 3 x 10 before the failure, 1 x 10 after
    # Held 650 + 410 = 1060 GPU-s: 1000 useful, 40 checkpointing, 20 lost.
    assert m["allocated_gpu_s"] == pytest.approx(1060)
    assert runs["J"].waited == 100 and runs["J"].finished == 1160
    assert failures.asked == [0.0, 750.0]  # first draw at the start, next after repair
    down = m["series"]["down_gpu_pct"]  # equal time slices: their mean is the overall mean
    assert sum(down) / len(down) == pytest.approx(100 * 100 / 1160, abs=0.01)


def test_failed_node_is_cordoned_until_repair() -> None:
    # Two 1-GPU nodes; n0 fails at 50 while K runs there. K moves to n1 at once; a job
    # arriving at 60 must wait for n0's repair at 150.
    jobs = [job("K", duration=500), job("M", arrival=60, duration=10)]
    result = run_queue(
        [node("n0", gpus=1), node("n1", gpus=1)],
        jobs,
        [QuotaTenant("a", 2 * G)],
        QueueConfig(policy="first-fit"),
        ScriptedFailures([50.0, math.inf]),
    )
    runs = by_name(result)
    assert runs["K"].waited == 0 and runs["K"].finished == 550  # lost 50 s, no checkpoint
    assert runs["M"].waited == 90
    assert result.metrics["lost_gpu_s"]["failure"] == 50


def test_rejects_jobs_that_can_never_run() -> None:
    jobs = [job("big", gpus=8), job("over-quota", gpus=3), job("ok")]
    result = replay([node()], jobs, [QuotaTenant("a", 2 * G)])
    assert result.metrics["rejected"] == 2 and result.metrics["completed"] == 1
