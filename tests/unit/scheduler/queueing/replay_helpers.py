"""Small replays for the queueing tests: nodes, jobs, tenants, and running a trace."""

from __future__ import annotations

from gateway_control.scheduler.cluster import Node, Pod
from gateway_control.scheduler.queueing.jobs import Job
from gateway_control.scheduler.queueing.queue_config import QueueConfig
from gateway_control.scheduler.queueing.runs import JobRun, QueueResult
from gateway_control.scheduler.queueing.simulator import run_queue
from gateway_control.scheduler.queueing.tenancy import QuotaTenant

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


def reclaim_trace(min_runtime: float = 0.0) -> list[Job]:
    """a1..a4 (tenant a, nominal 2) fill the 4-GPU node at t=0, borrowing b's 2 idle GPUs;
    b1 (tenant b, within its nominal) arrives at t=100 and needs one back."""
    jobs = [job(f"a{i}", "a", min_runtime=min_runtime) for i in range(1, 5)]
    return [*jobs, job("b1", "b", arrival=100, duration=100)]
