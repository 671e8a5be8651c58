"""gateway_control.scheduler.experiments.jobtrace: job traces derived from openb rows."""

from __future__ import annotations

from pathlib import Path

from gateway_control.scheduler.experiments.jobtrace import (
    TraceOptions,
    derive_jobs,
    read_jobs,
    write_jobs,
)
from tests.unit.scheduler.experiments.openb_rows import write_openb


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
