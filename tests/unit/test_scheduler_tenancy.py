"""Queueing replay: quotas and cohort borrowing, preemption, checkpoints, failures, metrics.

The golden cases are small enough to follow by hand; each states the timeline it expects.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.scheduler.cluster import Node, Placement, Pod
from gateway.scheduler.experiments.jobtrace import TraceOptions, derive_jobs, read_jobs, write_jobs
from gateway.scheduler.policies.registry import POLICY_NAMES
from gateway.scheduler.queueing.checkpoint import (
    daly_interval,
    progress,
    run_length,
    young_interval,
)
from gateway.scheduler.queueing.config import QueueConfig, checkpoint_interval
from gateway.scheduler.queueing.jobs import Job
from gateway.scheduler.queueing.measures import Timeline, percentile
from gateway.scheduler.queueing.runs import JobRun, QueueResult
from gateway.scheduler.queueing.simulator import QueueSimulator, run_queue
from gateway.scheduler.queueing.state import QueueState
from gateway.scheduler.queueing.tenancy import (
    Quotas,
    QuotaTenant,
    equal_tenants,
    tenants_from_mapping,
)
from gateway.scheduler.queueing.victims import select_victims, victim_key

G = 1000  # one GPU in thousandths


def node(name: str = "n0", gpus: int = 4, model: str = "T4") -> Node:
    return Node(name=name, gpus=gpus, gpu_model=model, cpu_milli=64000, memory_mib=262144)


def job(
    name: str,
    tenant: str = "a",
    arrival: float = 0.0,
    duration: float = 1000.0,
    gpus: int = 1,
    priority: int = 0,
    preemptible: bool = True,
    interval: float = 0.0,
    cost: float = 0.0,
    min_runtime: float = 0.0,
    models: str = "",
) -> Job:
    pod = Pod(
        name, gpus, G if gpus else 0, 1000, 1024, frozenset(m for m in models.split("|") if m)
    )
    return Job(
        pod=pod,
        arrival=arrival,
        duration=duration,
        tenant=tenant,
        priority=priority,
        preemptible=preemptible,
        checkpoint_interval=interval,
        checkpoint_cost=cost,
        min_runtime=min_runtime,
    )


def replay(
    nodes: list[Node],
    jobs: list[Job],
    tenants: list[QuotaTenant],
    policy: str = "first-fit",
    on_preempt: str = "auto",
) -> QueueResult:
    return run_queue(nodes, jobs, tenants, QueueConfig(policy=policy, on_preempt=on_preempt))


def by_name(result: QueueResult) -> dict[str, JobRun]:
    return {run.job.name: run for run in result.runs}


def pair(quota_a: int = 2, quota_b: int = 2, cohort: str = "c") -> list[QuotaTenant]:
    return [QuotaTenant("a", quota_a * G, cohort), QuotaTenant("b", quota_b * G, cohort)]


# --- checkpoint arithmetic ---------------------------------------------------------------


def test_young_and_daly_intervals() -> None:
    # C = 60 s, M = 1 day: Young sqrt(2 * 60 * 86400) = 3219.94 s.
    assert young_interval(60, 86400) == pytest.approx(3219.9379, abs=1e-3)
    # Daly: 3219.94 * (1 + sqrt(60/172800)/3 + (60/172800)/9) - 60 = 3180.06 s.
    assert daly_interval(60, 86400) == pytest.approx(3180.0625, abs=1e-3)
    # Daly's form when the cost is at least twice the MTBF: the MTBF.
    assert daly_interval(500, 200) == 200
    with pytest.raises(ValueError):
        young_interval(0, 100)


def test_progress_through_checkpoint_cycles() -> None:
    # 3600 s of work, a checkpoint every 1000 s costing 100 s: 3 checkpoints, 3900 s.
    assert run_length(3600, 1000, 100) == 3900
    writing = progress(1050, 3600, 1000, 100)  # 50 s into the first checkpoint
    assert (writing.done, writing.committed, writing.writing_left, writing.overhead) == (
        1000,
        0,
        50,
        50,
    )
    mid = progress(2500, 3600, 1000, 100)
    assert (mid.done, mid.committed, mid.unsaved, mid.overhead) == (2300, 2000, 300, 200)
    end = progress(3900, 3600, 1000, 100)
    assert (end.done, end.committed, end.overhead) == (3600, 3000, 300)
    never = progress(700, 1000, 0, 50)  # interval 0: never checkpoints
    assert (never.done, never.unsaved) == (700, 700)


def test_checkpoint_interval_rule() -> None:
    j = job("j", cost=60, interval=999)
    assert checkpoint_interval(j, "trace", 86400) == 999
    assert checkpoint_interval(j, "young", 86400) == pytest.approx(young_interval(60, 86400))
    assert checkpoint_interval(j, "daly", 86400) == pytest.approx(daly_interval(60, 86400))
    assert checkpoint_interval(job("free", interval=5), "young", 86400) == 5  # no cost


# --- quotas ------------------------------------------------------------------------------


def test_quota_borrowing_rules() -> None:
    quotas = Quotas(
        [
            QuotaTenant("a", 2 * G, "c", borrowing_limit_milli=1 * G),
            QuotaTenant("b", 2 * G, "c"),
            QuotaTenant("solo", 1 * G),
        ]
    )
    assert quotas.admissible("a", 2 * G)  # nominal
    quotas.charge("a", "T4", 2 * G)
    assert quotas.admissible("a", 1 * G)  # borrows 1 of b's idle 2
    assert not quotas.admissible("a", 2 * G)  # over its borrowing limit of 1
    quotas.charge("b", "T4", 2 * G)
    assert not quotas.admissible("a", 1 * G)  # the cohort has nothing idle
    assert quotas.admissible("solo", 1 * G) and not quotas.admissible("solo", 1001)
    assert quotas.ceiling("a") == 3 * G and quotas.ceiling("b") == 4 * G
    assert quotas.ceiling("solo") == 1 * G


def test_model_caps() -> None:
    quotas = Quotas([QuotaTenant("a", 8 * G, model_caps_milli={"V100": 1 * G})])
    assert quotas.model_allowed("a", "V100", G) and quotas.model_allowed("a", "T4", 5 * G)
    quotas.charge("a", "V100", G)
    assert not quotas.model_allowed("a", "V100", 1)


def test_tenants_from_yaml_mapping() -> None:
    tenants = tenants_from_mapping(
        {
            "tenants": {
                "x": {"gpus": 1.5, "cohort": "c", "borrowing_limit": 2, "weight": 2},
                "y": {"gpus": 4, "models": {"A10": 1}},
            }
        }
    )
    x, y = tenants
    assert (x.quota_milli, x.cohort, x.borrowing_limit_milli, x.weight) == (1500, "c", 2000, 2.0)
    assert (y.quota_milli, y.cohort, y.borrowing_limit_milli) == (4000, "", None)
    assert y.model_caps_milli == {"A10": 1000}
    with pytest.raises(ValueError):
        tenants_from_mapping({"tenants": {"z": {"gpus": 1, "oops": 2}}})
    assert [t.quota_milli for t in equal_tenants(["p", "q", "r"], 10 * G)] == [3333] * 3


# --- borrowing, reclaim, fair share ---------------------------------------------------------


def reclaim_trace(min_runtime: float = 0.0) -> list[Job]:
    """a1..a4 (tenant a, nominal 2) fill the 4-GPU node at t=0, borrowing b's 2 idle GPUs;
    b1 (tenant b, within its nominal) arrives at t=100 and needs one back."""
    jobs = [job(f"a{i}", "a", min_runtime=min_runtime) for i in range(1, 5)]
    return [*jobs, job("b1", "b", arrival=100, duration=100)]


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


def test_no_borrowing_without_cohort() -> None:
    # Same trace, each tenant alone: a may use only its 2 GPUs, so a3 and a4 wait.
    result = replay([node()], reclaim_trace(), pair(cohort=""))
    runs = by_name(result)
    assert not result.preemptions
    assert runs["a3"].waited == 1000 and runs["a4"].waited == 1000
    assert runs["b1"].waited == 0


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


# --- victim order ---------------------------------------------------------------------------


def test_victim_key_order() -> None:
    # (name, tenant borrowing, priority, start order)
    candidates = [("own-low", False, 0, 5), ("old", True, 5, 1), ("young", True, 5, 3)]
    candidates.append(("low", True, 1, 0))
    ordered = sorted(candidates, key=lambda c: victim_key(c[1], c[2], c[3]))
    assert [c[0] for c in ordered] == ["low", "young", "old", "own-low"]


def test_select_victims_is_minimal() -> None:
    # Freed GPU must reach 4: greedy takes 1, 2, 2 (5); giving back v2 leaves 3, too few,
    # but giving back v1 leaves 4.
    sizes = {"v1": 1, "v2": 2, "v3": 2, "v4": 1}
    state = {"free": 0}

    def take(v: str) -> None:
        state["free"] += sizes[v]

    def give_back(v: str) -> None:
        state["free"] -= sizes[v]

    victims = select_victims(
        ["v1", "v2", "v3", "v4"], lambda v: True, take, give_back, lambda: state["free"] >= 4
    )
    assert victims == ["v2", "v3"] and state["free"] == 4
    state["free"] = 0
    assert select_victims(["v1"], lambda v: True, take, give_back, lambda: False) is None
    assert state["free"] == 0  # trials undone


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


def test_model_caps_restrict_placement() -> None:
    # QuotaTenant a may hold one V100 GPU: its second job goes to the T4 node even though the
    # V100 node comes first; the third (V100 only) waits for the first to finish.
    nodes = [node("v", gpus=2, model="V100"), node("t", gpus=2, model="T4")]
    tenants = [QuotaTenant("a", 4 * G, model_caps_milli={"V100": G})]
    jobs = [job("j1", duration=100), job("j2", duration=100), job("j3", models="V100")]
    result = replay(nodes, jobs, tenants)
    runs = by_name(result)
    assert runs["j1"].model == "V100" and runs["j2"].model == "T4"
    assert runs["j3"].waited == 100


# --- checkpoint on preemption vs lost work --------------------------------------------------


def low_high(arrival: float) -> list[Job]:
    """L (priority 0, 1000 s, no periodic checkpoint, checkpoint cost 50 s) runs on the only
    GPU; H (priority 1, 100 s) arrives at `arrival` and preempts it."""
    return [job("L", cost=50), job("H", arrival=arrival, duration=100, priority=1)]


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


# --- failures -------------------------------------------------------------------------------


@dataclass
class ScriptedFailures:
    """Failure times in order of asking; afterwards never."""

    times: list[float]
    repair_s: float = 100.0
    asked: list[float] = field(default_factory=list)

    def next_failure(self, up_since: float) -> float:
        self.asked.append(up_since)
        return self.times.pop(0) if self.times else math.inf


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


# --- invariants -----------------------------------------------------------------------------


class CheckedState(QueueState):
    """Checks after every start that no quota, borrowing limit or model cap is exceeded."""

    starts = 0

    def start(self, run: JobRun, pod: Pod, placement: Placement, now: float, delay: float) -> None:
        super().start(run, pod, placement, now, delay)
        CheckedState.starts += 1
        quotas = self.quotas
        for name, tenant in quotas.tenants.items():
            assert quotas.usage[name] <= quotas.ceiling(name)
            for model, cap in tenant.model_caps_milli.items():
                assert quotas.model_usage[name].get(model, 0) <= cap
        for cohort, used in quotas.cohort_usage.items():
            assert used <= quotas.cohort_nominal[cohort]
        assert sum(quotas.usage.values()) == self.allocated_milli


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_quotas_never_exceeded(policy: str) -> None:
    rng = random.Random(7)
    nodes = [node("v0", 8, "V100"), node("v1", 8, "V100"), node("t0", 4, "T4"), node("t1", 2)]
    tenants = [
        QuotaTenant("a", 6 * G, "c", borrowing_limit_milli=3 * G, model_caps_milli={"V100": 5 * G}),
        QuotaTenant("b", 8 * G, "c", weight=2),
        QuotaTenant("c", 4 * G, "c", borrowing_limit_milli=0),
        QuotaTenant("d", 2 * G),
    ]
    jobs = []
    for i in range(150):
        gpus = rng.choice([0, 1, 1, 1, 2, 4])
        jobs.append(
            job(
                f"j{i}",
                rng.choice("abcd"),
                arrival=rng.uniform(0, 2000),
                duration=rng.uniform(10, 600),
                gpus=gpus,
                priority=rng.choice([0, 1, 2]),
                preemptible=rng.random() < 0.9,
                interval=rng.choice([0, 60]),
                cost=rng.choice([0, 5, 30]),
                min_runtime=rng.choice([0, 50]),
                models=rng.choice(["", "", "V100", "T4"]),
            )
        )
    config = QueueConfig(policy=policy, seed=3, fail_mtbf_s=1800, repair_s=300)
    result = QueueSimulator(CheckedState(nodes, jobs, tenants, config)).run()
    m = result.metrics
    assert m["completed"] + m["rejected"] == 150 and m["unfinished"] == 0
    assert m["preemptions"]["total"] > 0 and m["failures"]["node_failures"] > 0
    # Every finished job did exactly its work once.
    useful = sum(r.job.duration * r.job.gpus for r in result.runs if not math.isnan(r.finished))
    assert m["useful_gpu_s"] == pytest.approx(useful, abs=1)


def test_rejects_jobs_that_can_never_run() -> None:
    jobs = [job("big", gpus=8), job("over-quota", gpus=3), job("ok")]
    result = replay([node()], jobs, [QuotaTenant("a", 2 * G)])
    assert result.metrics["rejected"] == 2 and result.metrics["completed"] == 1


# --- metrics --------------------------------------------------------------------------------


def test_percentile_interpolates() -> None:
    assert percentile([4, 1, 3, 2], 50) == 2.5
    assert percentile([1, 2, 3, 4], 95) == pytest.approx(3.85)
    assert math.isnan(percentile([], 50))


def test_timeline_means_and_buckets() -> None:
    timeline = Timeline()
    timeline.record(0, (100.0,))
    timeline.record(10, (0.0,))
    assert timeline.means(0, 40) == (25.0,)
    assert timeline.buckets(0, 40, 4) == [(0, (100.0,)), (10, (0.0,)), (20, (0.0,)), (30, (0.0,))]
    assert timeline.buckets(5, 15, 1) == [(5, (50.0,))]


# --- trace and command line -----------------------------------------------------------------

POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time\n"
)
PODS = [
    "p0,4000,8192,1,1000,,LS,Running,0,3600,0",
    "p1,2000,4096,1,500,,BE,Succeeded,100,400,100",
    "p2,8000,16384,2,1000,,Burstable,Running,200,5000,200",
    "p3,1000,2048,0,0,,BE,Failed,300,300,300",
    "p4,4000,8192,1,1000,T4,Guaranteed,Running,400,2400,400",
    "p5,2000,4096,1,250,,BE,Pending,500,900,",
]


def write_openb(tmp_path: Path) -> tuple[Path, Path]:
    pods = tmp_path / "pods.csv"
    pods.write_text(POD_HEADER + "\n".join(PODS) + "\n")
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,131072,2,T4\nn1,32000,131072,2,P100\n"
    )
    return pods, nodes


def test_derive_jobs_from_openb_rows(tmp_path: Path) -> None:
    pods, _ = write_openb(tmp_path)
    import csv

    rows = list(csv.DictReader(pods.open()))
    jobs = {j.name: j for j in derive_jobs(rows, TraceOptions(tenants=3, seed=5, time_scale=10))}
    assert (jobs["p1"].arrival, jobs["p1"].duration) == (10, 300)
    assert jobs["p3"].duration == 1  # deleted at creation: at least one second
    assert [jobs[p].priority for p in ("p0", "p1", "p2", "p4")] == [2, 0, 1, 2]
    assert not jobs["p4"].preemptible and jobs["p0"].preemptible
    assert jobs["p4"].pod.gpu_models == frozenset({"T4"}) and jobs["p5"].pod.gpu_milli == 250
    again = derive_jobs(rows, TraceOptions(tenants=3, seed=5, time_scale=10))
    assert [j.tenant for j in again] == [j.tenant for j in jobs.values()]
    capped = derive_jobs(rows, TraceOptions(max_duration=600))
    assert max(j.duration for j in capped) == 600
    doubled = derive_jobs(rows, TraceOptions(copies=2))
    assert len(doubled) == 12 and {j.name for j in doubled} >= {"p0", "p0-c1"}
    assert {j.arrival for j in doubled if j.name.startswith("p1")} == {100}
    trace = tmp_path / "trace.csv"
    write_jobs(trace, again)
    assert read_jobs(trace) == again


def test_cli_trace_then_queue(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pods, nodes = write_openb(tmp_path)
    trace = tmp_path / "trace.csv"
    derive = ["simulate", "trace", "--pods", str(pods), "--out", str(trace)]
    assert main([*derive, "--tenants", "2", "--seed", "1"]) == 0
    capsys.readouterr()
    args = ["simulate", "queue", "--nodes", str(nodes), "--trace", str(trace)]
    assert main([*args, "--policy", "best-fit", "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["jobs"] == 6 and metrics["completed"] == 6
    assert metrics["policy"] == "best-fit" and len(metrics["series"]["t_s"]) == 200
    assert set(metrics["queueing"]["by_tenant"]) == {"t0", "t1"}
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text("tenants:\n  t0: {gpus: 2, cohort: c}\n  t1: {gpus: 2, cohort: c}\n")
    with_failures = ["--fail-mtbf", "0.5", "--seed", "2", "--checkpoint-rule", "daly"]
    assert main([*args, "--tenants", str(tenants), *with_failures, "--json"]) == 0
    failing = json.loads(capsys.readouterr().out)
    assert failing["completed"] == 6 and failing["fail_mtbf_h"] == 0.5
    assert main(args) == 0
    assert "tenant t0" in capsys.readouterr().out
    assert main([*args, "--checkpoint-rule", "young"]) == 2  # needs an MTBF


def test_cli_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    pods, nodes = write_openb(tmp_path)
    trace = tmp_path / "trace.csv"
    assert main(["simulate", "trace", "--pods", str(pods), "--out", str(trace)]) == 0
    plots = tmp_path / "plots"
    args = ["simulate", "queue", "--nodes", str(nodes), "--trace", str(trace)]
    assert main([*args, "--plot", str(plots), "--json"]) == 0
    assert (plots / "utilization.png").stat().st_size > 0
    assert (plots / "queueing_cdf.png").stat().st_size > 0
