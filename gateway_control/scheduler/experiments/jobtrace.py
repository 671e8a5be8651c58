"""Job traces: the CSV format of `simulate queue`, and deriving one from the openb pod list.

`derive_jobs` is pure (rows in, jobs out); `read_jobs`, `write_jobs` and `read_pod_rows`
do the file I/O.
"""

from __future__ import annotations

import csv
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gateway_control.scheduler.cluster import GPU_MILLI, Pod
from gateway_control.scheduler.queueing.jobs import Job

COLUMNS = (
    "name",
    "arrival",
    "duration",
    "num_gpu",
    "gpu_milli",
    "gpu_spec",
    "cpu_milli",
    "memory_mib",
    "tenant",
    "priority",
    "preemptible",
    "checkpoint_interval",
    "checkpoint_cost",
    "min_runtime",
)

# openb QoS class -> priority (higher wins): latency-sensitive and guaranteed pods are high,
# burstable medium, best-effort low.
QOS_PRIORITY = {"LS": 2, "Guaranteed": 2, "Burstable": 1, "BE": 0}
PRIORITY_NAMES = {2: "high", 1: "medium", 0: "low"}
NON_PREEMPTIBLE_QOS = frozenset({"Guaranteed"})


def make_pod(
    name: str, num_gpu: int, gpu_milli: int, cpu_milli: int, memory_mib: int, spec: str
) -> Pod:
    """A pod with the openb normalisation: no GPU share for a CPU-only pod, whole GPUs for
    a multi-GPU pod or a share outside (0, 1000]."""
    if num_gpu == 0:
        gpu_milli = 0
    elif num_gpu > 1 or gpu_milli <= 0 or gpu_milli > GPU_MILLI:
        gpu_milli = GPU_MILLI
    return Pod(
        name=name,
        num_gpu=num_gpu,
        gpu_milli=gpu_milli,
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        gpu_models=frozenset(m for m in spec.split("|") if m),
    )


@dataclass(frozen=True, slots=True)
class TraceOptions:
    """How `derive_jobs` turns pods into jobs (times in seconds)."""

    tenants: int = 4
    seed: int = 0
    skew: float = 1.0  # tenant k is drawn with weight 1 / (k + 1) ** skew; 0: uniform
    time_scale: float = 1.0  # arrivals divided by this (durations kept)
    max_duration: float = 0.0  # cap on a job's duration; 0: none
    copies: int = 1  # jobs per pod, arriving together (as if several teams ran the same)
    checkpoint_interval: float = 1800.0
    checkpoint_cost: float = 60.0
    min_runtime: float = 300.0

    def __post_init__(self) -> None:
        if self.tenants < 1 or self.copies < 1:
            raise ValueError("at least one tenant and one copy")
        if self.time_scale <= 0:
            raise ValueError("time_scale must be positive")
        if min(self.skew, self.max_duration, self.checkpoint_interval) < 0:
            raise ValueError("skew, max_duration and checkpoint_interval must not be negative")
        if min(self.checkpoint_cost, self.min_runtime) < 0:
            raise ValueError("checkpoint_cost and min_runtime must not be negative")


def tenant_names(count: int) -> list[str]:
    """The generated tenants' names: t0, t1, ..."""
    return [f"t{k}" for k in range(count)]


def derive_jobs(rows: Iterable[Mapping[str, str]], options: TraceOptions) -> list[Job]:
    """Jobs from openb pod rows: arrival = creation_time / time_scale, duration =
    deletion_time - creation_time (at least 1 s, at most max_duration if set), priority
    from the QoS class (QOS_PRIORITY), preemptible unless Guaranteed, tenant drawn with
    the seed (Zipf-like weights, so the first tenants get more jobs), `copies` jobs per
    pod (copy k > 0 named NAME-cK, its tenant drawn anew), sorted by arrival."""
    rng = random.Random(options.seed)
    names = tenant_names(options.tenants)
    weights = [1.0 / (k + 1) ** options.skew for k in range(options.tenants)]
    jobs = []
    for row in rows:
        created = float(row["creation_time"])
        duration = max(float(row["deletion_time"]) - created, 1.0)
        if options.max_duration > 0:
            duration = min(duration, options.max_duration)
        qos = row.get("qos") or "BE"
        for copy in range(options.copies):
            name = row["name"] if copy == 0 else f"{row['name']}-c{copy}"
            jobs.append(
                Job(
                    pod=make_pod(
                        name,
                        int(row["num_gpu"]),
                        int(row["gpu_milli"] or 0),
                        int(row["cpu_milli"]),
                        int(row["memory_mib"]),
                        row.get("gpu_spec") or "",
                    ),
                    arrival=round(created / options.time_scale, 3),
                    duration=duration,
                    tenant=rng.choices(names, weights)[0],
                    priority=QOS_PRIORITY.get(qos, 0),
                    preemptible=qos not in NON_PREEMPTIBLE_QOS,
                    checkpoint_interval=options.checkpoint_interval,
                    checkpoint_cost=options.checkpoint_cost,
                    min_runtime=options.min_runtime,
                )
            )
    jobs.sort(key=lambda j: (j.arrival, j.name))
    return jobs


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(round(value, 3))


def job_row(job: Job) -> list[str]:
    """One CSV row (in COLUMNS order)."""
    pod = job.pod
    return [
        pod.name,
        _number(job.arrival),
        _number(job.duration),
        str(pod.num_gpu),
        str(pod.gpu_milli),
        "|".join(sorted(pod.gpu_models)),
        str(pod.cpu_milli),
        str(pod.memory_mib),
        job.tenant,
        str(job.priority),
        "1" if job.preemptible else "0",
        _number(job.checkpoint_interval),
        _number(job.checkpoint_cost),
        _number(job.min_runtime),
    ]


def job_from_row(row: Mapping[str, str]) -> Job:
    """A job from a CSV row; only name, arrival, duration, num_gpu, cpu_milli and
    memory_mib are required, the other columns default to the `Job` defaults."""

    def number(key: str, default: float = 0.0) -> float:
        text = row.get(key)
        return float(text) if text else default

    preemptible = (row.get("preemptible") or "1").strip().lower()
    return Job(
        pod=make_pod(
            row["name"],
            int(row["num_gpu"]),
            int(row.get("gpu_milli") or 0),
            int(row["cpu_milli"]),
            int(row["memory_mib"]),
            row.get("gpu_spec") or "",
        ),
        arrival=float(row["arrival"]),
        duration=float(row["duration"]),
        tenant=row.get("tenant") or "default",
        priority=int(row.get("priority") or 0),
        preemptible=preemptible not in ("0", "false", "no"),
        checkpoint_interval=number("checkpoint_interval"),
        checkpoint_cost=number("checkpoint_cost"),
        min_runtime=number("min_runtime"),
    )


def read_jobs(path: str | Path) -> list[Job]:
    """Jobs from a trace CSV (COLUMNS)."""
    with open(path, newline="") as f:
        return [job_from_row(row) for row in csv.DictReader(f)]


def write_jobs(path: str | Path, jobs: Sequence[Job]) -> None:
    """Write `jobs` as a trace CSV."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        writer.writerows(job_row(job) for job in jobs)


def read_pod_rows(path: str | Path) -> list[dict[str, str]]:
    """The rows of an openb pod list."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))
