"""`gateway simulate queue` (replay a job trace) and `gateway simulate trace` (derive a job
trace from the openb pod list)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from gateway_control.scheduler.cluster import load_nodes
from gateway_control.scheduler.experiments.jobtrace import (
    TraceOptions,
    derive_jobs,
    read_jobs,
    read_pod_rows,
    write_jobs,
)
from gateway_control.scheduler.policies.registry import BEST_POLICY, POLICY_NAMES
from gateway_control.scheduler.queueing.failures import HOUR
from gateway_control.scheduler.queueing.queue_config import (
    CHECKPOINT_RULES,
    ON_PREEMPT,
    QueueConfig,
)
from gateway_control.scheduler.queueing.simulator import run_queue
from gateway_control.scheduler.queueing.tenancy import equal_tenants, load_tenants


def add_queue_arguments(queue: argparse.ArgumentParser) -> None:
    """The options of `simulate queue`."""
    queue.add_argument("--nodes", required=True, help="openb node list CSV")
    queue.add_argument("--trace", required=True, help="job trace CSV (see `simulate trace`)")
    queue.add_argument(
        "--policy",
        choices=POLICY_NAMES,
        default=BEST_POLICY,
        help=f"placement policy (default: {BEST_POLICY})",
    )
    queue.add_argument(
        "--tenants",
        help="tenants YAML (quotas, cohorts, weights); default: the trace's tenants with "
        "equal shares of the cluster in one cohort",
    )
    queue.add_argument("--fail-mtbf", type=float, help="node MTBF in hours (default: no failures)")
    queue.add_argument(
        "--repair", type=float, default=4.0, help="hours a failed node stays down (default 4)"
    )
    queue.add_argument("--seed", type=int, default=0, help="policy and failure seed (default 0)")
    queue.add_argument(
        "--on-preempt",
        choices=ON_PREEMPT,
        default="auto",
        help="a victim's unsaved work: auto = checkpoint when cheaper than losing it",
    )
    queue.add_argument(
        "--checkpoint-rule",
        choices=CHECKPOINT_RULES,
        default="trace",
        help="checkpoint intervals from the trace, or Young's / Daly's optimum (needs --fail-mtbf)",
    )
    queue.add_argument("--json", action="store_true", help="print the metrics as JSON")
    queue.add_argument("--plot", metavar="DIR", help="write PNG charts into DIR")


def run_queue_command(args: argparse.Namespace) -> int:
    """Replay a trace and print its metrics: JSON, or a summary table."""
    try:
        nodes = load_nodes(args.nodes)
        jobs = read_jobs(args.trace)
        if args.tenants:
            tenants = load_tenants(args.tenants)
        else:
            capacity = sum(node.gpus for node in nodes) * 1000
            tenants = equal_tenants(sorted({job.tenant for job in jobs}), capacity)
        config = QueueConfig(
            policy=args.policy,
            seed=args.seed,
            fail_mtbf_s=None if args.fail_mtbf is None else args.fail_mtbf * HOUR,
            repair_s=args.repair * HOUR,
            on_preempt=args.on_preempt,
            checkpoint_rule=args.checkpoint_rule,
        )
        started = time.perf_counter()
        result = run_queue(nodes, jobs, tenants, config)
    except (OSError, KeyError, ValueError) as exc:
        print(f"simulate queue: {exc}", file=sys.stderr)
        return 2
    elapsed = time.perf_counter() - started
    if args.plot:
        from gateway_control.scheduler.experiments.plots import write_plots

        for path in write_plots(result, args.plot):
            print(f"wrote {path}", file=sys.stderr)
    metrics = result.metrics
    if args.json:
        print(json.dumps(metrics))
        return 0
    print(
        f"{metrics['policy']}: {metrics['completed']}/{metrics['jobs']} jobs done "
        f"({metrics['rejected']} rejected) in {metrics['makespan_s'] / HOUR:.1f} h simulated, "
        f"{elapsed:.1f} s real; allocation {100 * metrics['gpu_allocation_ratio']:.1f}%, "
        f"effective throughput {metrics['effective_throughput_gpus']:.1f} GPUs, "
        f"preemptions {metrics['preemptions']['total']}, "
        f"lost {metrics['lost_gpu_s']['total']:.0f} GPU-s"
    )
    print(f"{'queue':<14}{'jobs':>7}{'p50 s':>10}{'p95 s':>10}")
    queueing = metrics["queueing"]
    rows = [("all", queueing["all"])]
    rows += [(f"tenant {t}", s) for t, s in queueing["by_tenant"].items()]
    rows += [(f"priority {p}", s) for p, s in queueing["by_priority"].items()]
    for label, stats in rows:
        p50 = "-" if stats["p50_s"] is None else f"{stats['p50_s']:.1f}"
        p95 = "-" if stats["p95_s"] is None else f"{stats['p95_s']:.1f}"
        print(f"{label:<14}{stats['jobs']:>7}{p50:>10}{p95:>10}")
    return 0


def add_trace_arguments(trace: argparse.ArgumentParser) -> None:
    """The options of `simulate trace`."""
    defaults = TraceOptions()
    trace.add_argument("--pods", required=True, help="openb pod list CSV")
    trace.add_argument("--out", required=True, help="job trace CSV to write")
    trace.add_argument("--tenants", type=int, default=defaults.tenants, help="tenants t0..tN-1")
    trace.add_argument("--seed", type=int, default=defaults.seed, help="tenant draw seed")
    trace.add_argument(
        "--skew",
        type=float,
        default=defaults.skew,
        help="tenant k drawn with weight 1/(k+1)^skew (0: uniform; default 1)",
    )
    trace.add_argument(
        "--time-scale",
        type=float,
        default=defaults.time_scale,
        help="divide arrival times by this (durations kept) to load the cluster more",
    )
    trace.add_argument(
        "--max-duration", type=float, default=defaults.max_duration, help="cap, seconds (0: none)"
    )
    trace.add_argument(
        "--copies", type=int, default=defaults.copies, help="jobs per pod, arriving together"
    )
    trace.add_argument("--checkpoint-interval", type=float, default=defaults.checkpoint_interval)
    trace.add_argument("--checkpoint-cost", type=float, default=defaults.checkpoint_cost)
    trace.add_argument("--min-runtime", type=float, default=defaults.min_runtime)


def run_trace_command(args: argparse.Namespace) -> int:
    """Derive a job trace from an openb pod list and write it."""
    try:
        options = TraceOptions(
            tenants=args.tenants,
            seed=args.seed,
            skew=args.skew,
            time_scale=args.time_scale,
            max_duration=args.max_duration,
            copies=args.copies,
            checkpoint_interval=args.checkpoint_interval,
            checkpoint_cost=args.checkpoint_cost,
            min_runtime=args.min_runtime,
        )
        jobs = derive_jobs(read_pod_rows(args.pods), options)
        write_jobs(args.out, jobs)
    except (OSError, KeyError, ValueError) as exc:
        print(f"simulate trace: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {len(jobs)} jobs to {args.out}")
    return 0
