"""The metrics document of a finished queueing replay. Pure."""

from __future__ import annotations

from typing import Any

from gateway_control.scheduler.cluster import GPU_MILLI
from gateway_control.scheduler.queueing.failures import HOUR
from gateway_control.scheduler.queueing.measures import SERIES, Timeline, wait_summary
from gateway_control.scheduler.queueing.runs import DONE, REJECTED, Preemption, QueueResult
from gateway_control.scheduler.queueing.state import QueueState


def report(
    state: QueueState,
    timeline: Timeline,
    preemptions: list[Preemption],
    start: float,
    end: float,
) -> QueueResult:
    """Metrics over [start, end] (first arrival to last completion) of a finished replay's
    state, its `timeline` and `preemptions`: raw queueing times per tenant and priority,
    each job's final state and the preemptions."""
    config = state.config
    waits_by_tenant: dict[str, list[float]] = {t: [] for t in state.quotas.tenants}
    waits_by_priority: dict[int, list[float]] = {p: [] for p in state.priorities}
    preempted_jobs = 0
    for run in state.runs:
        if run.state == DONE:
            waits_by_tenant[run.job.tenant].append(run.waited)
            waits_by_priority[run.job.priority].append(run.waited)
        preempted_jobs += run.preempted > 0
    totals = state.totals
    makespan = end - start
    means = timeline.means(start, end)
    allocated_gpu_s = means[0] / 100.0 * state.cluster.capacity_milli / GPU_MILLI * makespan
    buckets = timeline.buckets(start, end, config.series_points)
    series: dict[str, list[float]] = {"t_s": [round(t, 1) for t, _ in buckets]}
    for d, name in enumerate(SERIES):
        series[name] = [round(values[d], 3) for _, values in buckets]
    by_tenant = {}
    for tenant, waits in waits_by_tenant.items():
        counters = totals.by_tenant.get(tenant, {})
        by_tenant[tenant] = {
            **wait_summary(waits),
            "preemptions": int(counters.get("preemptions", 0)),
            "lost_gpu_s": round(counters.get("lost_gpu_s", 0.0), 1),
            "useful_gpu_s": round(counters.get("useful_gpu_s", 0.0), 1),
        }
    states = [run.state for run in state.runs]
    metrics: dict[str, Any] = {
        "policy": config.policy,
        "seed": config.seed,
        "fail_mtbf_h": None if config.fail_mtbf_s is None else config.fail_mtbf_s / HOUR,
        "repair_h": config.repair_s / HOUR,
        "on_preempt": config.on_preempt,
        "checkpoint_rule": config.checkpoint_rule,
        "nodes": len(state.nodes),
        "total_gpus": state.cluster.capacity_milli / GPU_MILLI,
        "jobs": len(state.runs),
        "completed": states.count(DONE),
        "rejected": states.count(REJECTED),
        "unfinished": len(states) - states.count(DONE) - states.count(REJECTED),
        "start_s": start,
        "end_s": end,
        "makespan_s": makespan,
        "gpu_allocation_ratio": round(means[0] / 100.0, 5),
        "fragmented_gpu_ratio": round(means[1] / 100.0, 5),
        "queueing": {
            "all": wait_summary([w for ws in waits_by_tenant.values() for w in ws]),
            "by_tenant": by_tenant,
            "by_priority": {str(p): wait_summary(ws) for p, ws in waits_by_priority.items()},
        },
        "preemptions": {
            "total": totals.preemptions_reclaim + totals.preemptions_priority,
            "reclaim": totals.preemptions_reclaim,
            "priority": totals.preemptions_priority,
            "checkpointed": totals.checkpointed_preemptions,
            "jobs_preempted": preempted_jobs,
        },
        "failures": {"node_failures": totals.node_failures, "jobs_killed": totals.jobs_killed},
        "lost_gpu_s": {
            "total": round(totals.lost_preempt_gpu_s + totals.lost_failure_gpu_s, 1),
            "preemption": round(totals.lost_preempt_gpu_s, 1),
            "failure": round(totals.lost_failure_gpu_s, 1),
        },
        "checkpoint_gpu_s": round(totals.checkpoint_gpu_s, 1),
        "useful_gpu_s": round(totals.useful_gpu_s, 1),
        "allocated_gpu_s": round(allocated_gpu_s, 1),
        # Useful share of the GPU time jobs held (the rest: checkpoints, lost work).
        "goodput_ratio": round(totals.useful_gpu_s / allocated_gpu_s, 5)
        if allocated_gpu_s > 0
        else 0.0,
        "effective_throughput_gpus": round(totals.useful_gpu_s / makespan, 3)
        if makespan > 0
        else 0.0,
        "series": series,
    }
    return QueueResult(metrics, waits_by_tenant, waits_by_priority, state.runs, preemptions)
