"""gateway_control.scheduler.queueing.preemptor: reclaim and priority preemption, checkpoints.

The golden cases are small enough to follow by hand; each states the timeline it expects."""

from __future__ import annotations

import pytest

from gateway_control.scheduler.queueing.jobs import Job
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


def low_high(arrival: float) -> list[Job]:
    """L (priority 0, 1000 s, no periodic checkpoint, checkpoint cost 50 s) runs on the only
    GPU; H (priority 1, 100 s) arrives at `arrival` and preempts it."""
    return [job("L", cost=50), job("H", arrival=arrival, duration=100, priority=1)]


def test_borrowing_and_reclaim_by_preemption() -> None:
    # t=0: a borrows; t=100: b1 reclaims, the youngest borrowed job (a4) is preempted
    # (checkpoint free, so it keeps its 100 s); t=200: b1 done, a4 resumes with 900 s
    # left; t=1000: a1-a3 done; t=1100: a4 done.
    result = replay([node()], reclaim_trace(), pair())
    runs = by_name(result)
    assert [(p.time, p.victim, p.preemptor, p.reason) for p in result.preemptions] == [
        (100, "a4", "b1", "reclaim")
    ]
    assert runs["a4"].waited == 100 and runs["a4"].finished == 1100
    assert runs["b1"].waited == 0 and runs["b1"].finished == 200
    m = result.metrics
    assert m["preemptions"] == {
        "total": 1,
        "reclaim": 1,
        "priority": 0,
        "checkpointed": 1,
        "jobs_preempted": 1,
    }
    assert m["lost_gpu_s"]["total"] == 0
    assert m["makespan_s"] == 1100
    assert m["useful_gpu_s"] == 4100
    assert m["allocated_gpu_s"] == pytest.approx(4100) and m["goodput_ratio"] == 1.0
    assert m["effective_throughput_gpus"] == pytest.approx(4100 / 1100, abs=1e-3)
    # 4 of 4 GPUs for 1000 s, then 1 for 100 s.
    assert m["gpu_allocation_ratio"] == pytest.approx((4 * 1000 + 100) / (4 * 1100), abs=1e-5)
    a = m["queueing"]["by_tenant"]["a"]
    assert (a["jobs"], a["p50_s"], a["p95_s"], a["max_s"]) == (4, 0.0, 85.0, 100.0)
    assert m["queueing"]["by_tenant"]["b"]["p95_s"] == 0.0


def test_preemption_waits_for_minimum_runtime() -> None:
    # a's jobs may not be preempted before 300 s: b1 waits from 100 to 300.
    result = replay([node()], reclaim_trace(min_runtime=300), pair())
    runs = by_name(result)
    assert [(p.time, p.victim) for p in result.preemptions] == [(300, "a4")]
    assert runs["b1"].waited == 200 and runs["b1"].finished == 400
    assert runs["a4"].waited == 100 and runs["a4"].finished == 1100  # 300 s kept


def test_non_preemptible_jobs_are_never_victims() -> None:
    jobs = [job(f"a{i}", "a", preemptible=False) for i in range(1, 5)]
    result = replay([node()], [*jobs, job("b1", "b", arrival=100, duration=100)], pair())
    assert not result.preemptions
    assert by_name(result)["b1"].waited == 900  # until a1-a4 finish at 1000


def test_borrowers_jobs_go_before_own_lower_priority() -> None:
    # t=0: a1-a3 (a, priority 5; a borrows one) and b_low (b, priority 0) fill the node.
    # t=10: b_high (b, priority 9, within nominal) takes a's youngest, not b_low.
    jobs = [job(f"a{i}", "a", priority=5) for i in range(1, 4)]
    jobs += [job("b_low", "b"), job("b_high", "b", arrival=10, priority=9)]
    result = replay([node()], jobs, pair())
    assert [(p.victim, p.reason) for p in result.preemptions] == [("a3", "reclaim")]


def test_priority_preemption_within_a_tenant() -> None:
    # One tenant, 4 GPUs: p1_old, p2_a at t=0; p1_young, p2_b at t=5. High-priority jobs
    # at 10, 20, 30 take the lowest priority first, the youngest first within it.
    jobs = [
        job("p1_old", priority=1),
        job("p2_a", priority=2),
        job("p1_young", arrival=5, priority=1),
        job("p2_b", arrival=5, priority=2),
        job("h1", arrival=10, priority=3),
        job("h2", arrival=20, priority=3),
        job("h3", arrival=30, priority=3),
    ]
    result = replay([node()], jobs, [QuotaTenant("a", 4 * G)])
    assert [(p.time, p.victim, p.preemptor, p.reason) for p in result.preemptions] == [
        (10, "p1_young", "h1", "priority"),
        (20, "p1_old", "h2", "priority"),
        (30, "p2_b", "h3", "priority"),
    ]


def test_victims_free_one_node() -> None:
    # Two 2-GPU nodes: n0 runs a (t=0) and b (t=1), n1 runs c (t=2), all priority 0, and d
    # (t=3, priority 3). P (priority 9, 2 GPUs) needs a whole node: n0's two low-priority
    # jobs, not the youngest job c, whose node would also cost d.
    jobs = [
        job("a"),
        job("b", arrival=1),
        job("c", arrival=2),
        job("d", arrival=3, priority=3),
        job("P", arrival=10, gpus=2, priority=9),
    ]
    result = replay([node("n0", gpus=2), node("n1", gpus=2)], jobs, [QuotaTenant("a", 4 * G)])
    assert sorted(p.victim for p in result.preemptions) == ["a", "b"]
    assert by_name(result)["P"].waited == 0


def test_preemption_checkpoints_when_cheaper() -> None:
    # At 300 L has 300 s unsaved > 50 s: it checkpoints; H waits for it (50 s) and runs
    # 350-450; L resumes at 450 with 700 s left and ends at 1150.
    result = replay([node(gpus=1)], low_high(300), [QuotaTenant("a", G)])
    runs = by_name(result)
    assert result.preemptions[0].checkpointed
    assert runs["H"].waited == 50 and runs["H"].finished == 450
    assert runs["L"].finished == 1150
    assert result.metrics["checkpoint_gpu_s"] == 50
    assert result.metrics["lost_gpu_s"]["total"] == 0
    # GPU held 1150 s (the 50 s of checkpoint included) for 1100 s of work.
    assert result.metrics["goodput_ratio"] == pytest.approx(1100 / 1150, abs=1e-5)


def test_preemption_loses_work_when_cheaper_or_configured() -> None:
    # At 30 only 30 s are unsaved (< 50 s to checkpoint): they are dropped.
    auto = replay([node(gpus=1)], low_high(30), [QuotaTenant("a", G)])
    assert not auto.preemptions[0].checkpointed
    assert auto.metrics["lost_gpu_s"] == {"total": 30, "preemption": 30, "failure": 0}
    assert by_name(auto)["L"].finished == 1130  # restarts at 130 from zero
    # Configured to discard: the 300 s are lost even though a checkpoint was cheaper.
    discard = replay([node(gpus=1)], low_high(300), [QuotaTenant("a", G)], on_preempt="discard")
    assert discard.metrics["lost_gpu_s"]["preemption"] == 300
    assert by_name(discard)["L"].finished == 1400
    # Configured to checkpoint: 50 s charged even for 30 s of work.
    always = replay([node(gpus=1)], low_high(30), [QuotaTenant("a", G)], on_preempt="checkpoint")
    assert always.metrics["checkpoint_gpu_s"] == 50 and always.metrics["lost_gpu_s"]["total"] == 0
    assert by_name(always)["L"].finished == 1150  # 180 + 970
