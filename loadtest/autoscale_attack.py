"""The closed loop against the hostile tenants of issue 40, offline.

    .venv/bin/python -m loadtest.autoscale_attack [--json]

Replays each trace of loadtest/autoscale-attack/ (`gateway simulate autoscale`'s trace
format) under the loop on that directory's cluster.yaml (the demo's llm-small: 1 to 2
replicas of 16 slots, a 5 s interval, a minute of quiet before a replica goes), and
prints per trace: the replica loads and unloads in its first 5 minutes and in all 30, the
share of requests within their TTFT target, the requests refused, the GPU-seconds held,
and for the honest ramp how long after its demand crossed what one replica holds the
loop asked for the second replica (and when it was ready). Each is the same run as

    gateway simulate autoscale --cluster loadtest/autoscale-attack/cluster.yaml \\
        --trace loadtest/autoscale-attack/<trace>.yaml
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from gateway_control.cluster_config import load_cluster
from gateway_control.placement.autoscale_cli import load_trace
from gateway_control.placement.autoscale_sim import PolicyResult, run_policy

HERE = Path(__file__).resolve().parent / "autoscale-attack"
TRACES = ("globex", "acme", "both", "ramp")
MODEL = "llm-small"
LOAD_S = 2.0
# Where ramp.yaml's demand crosses what one replica holds at the 0.75 target (96 a second).
RAMP_CROSSES_S = 60 + 300 * (96 - 16) / (160 - 16)


def figures(name: str, result: PolicyResult) -> dict[str, object]:
    """One trace's figures."""
    ups = [t for t, model, step in result.changes if model == MODEL and step > 0]
    row: dict[str, object] = {
        "trace": name,
        "changes_5min": result.changes_within(300),
        "changes_30min": result.changes_within(1800),
        "slo_attainment": round(result.slo_attainment, 4),
        "refused": result.refused,
        "gpu_seconds": round(result.gpu_seconds, 1),
    }
    if name == "ramp":
        first = ups[0] if ups else None  # the ramp's first rise; negative: before it crossed
        row["up_after_crossing_s"] = None if first is None else round(first - RAMP_CROSSES_S, 1)
        row["ready_after_crossing_s"] = (
            None if first is None else round(first + LOAD_S - RAMP_CROSSES_S, 1)
        )
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    logging.getLogger("gateway_control.placement").setLevel(logging.ERROR)
    cluster = load_cluster(str(HERE / "cluster.yaml"))
    rows = []
    for name in TRACES:
        workload, problems = load_trace(str(HERE / f"{name}.yaml"))
        if workload is None:
            for problem in problems:
                print(problem)
            return 2
        rows.append(figures(name, run_policy(cluster, workload, loop=True, load_s=LOAD_S)))
    if args.json:
        print(json.dumps(rows))
        return 0
    columns = list(rows[-1])
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(str(row.get(c, "")) for c in columns) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
