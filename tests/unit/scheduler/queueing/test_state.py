"""gateway_control.scheduler.queueing.state: model caps restrict placement; quotas are
never exceeded."""

from __future__ import annotations

import math
import random

import pytest

from gateway_control.scheduler.cluster import Placement, Pod
from gateway_control.scheduler.policies.registry import POLICY_NAMES
from gateway_control.scheduler.queueing.queue_config import QueueConfig
from gateway_control.scheduler.queueing.runs import JobRun
from gateway_control.scheduler.queueing.simulator import QueueSimulator
from gateway_control.scheduler.queueing.state import QueueState
from gateway_control.scheduler.queueing.tenancy import QuotaTenant
from tests.unit.scheduler.queueing.replay_helpers import G, by_name, job, node, replay


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
