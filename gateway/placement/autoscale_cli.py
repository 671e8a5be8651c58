"""`gateway simulate autoscale`: static placement against the closed loop on one trace.

Imports nothing heavy at the top: `gateway --help` builds every sub-command's options,
and the simulation's modules create the gateway's metrics (files, in multiprocess mode).
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.placement.autoscale_sim import PolicyResult

# The benchmark's fleet, in the source tree.
DEFAULT_FLEET = (
    Path(__file__).resolve().parents[2] / "loadtest" / "autoscale-config" / "cluster.yaml"
)

COLUMNS = (
    "policy",
    "requests",
    "slo_attainment",
    "goodput_rps",
    "refused",
    "gpu_seconds",
    "replica_changes",
    "lost",
)


def add_autoscale_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `simulate autoscale`."""
    parser.add_argument(
        "--cluster",
        default=str(DEFAULT_FLEET),
        help="cluster.yaml with `autoscale:` deployments (default: the benchmark's fleet)",
    )
    parser.add_argument("--seed", type=int, default=0, help="the arrivals' seed (default 0)")
    parser.add_argument(
        "--load-s", type=float, default=2.0, help="seconds a replica takes to load (default 2)"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--plot", metavar="PNG", help="chart demand and replicas into PNG")


def run_autoscale_command(args: argparse.Namespace) -> int:
    """Replay the shifting workload under both policies; print the table."""
    from gateway.config.cluster_config import check_cluster
    from gateway.placement.autoscale_sim import SHIFTING, run_policy

    cluster, _, problems = check_cluster(args.cluster)
    if cluster is None:
        for problem in problems:
            print(problem)
        return 2
    workload = replace(SHIFTING, seed=args.seed)
    # The loop's decisions are warnings on a live leader; here the table says enough.
    logging.getLogger("gateway.placement").setLevel(logging.ERROR)
    results = [
        run_policy(cluster, workload, loop=False, load_s=args.load_s),
        run_policy(cluster, workload, loop=True, load_s=args.load_s),
    ]
    if args.json:
        rows = [r.row() | {"timeline": [asdict(s) for s in r.timeline]} for r in results]
        print(json.dumps(rows))
    else:
        print(format_table(results))
    if args.plot:
        write_chart(results, args.plot)
    return 0


def format_table(results: Sequence[PolicyResult]) -> str:
    """The figures as a Markdown table."""
    rows = [[str(r.row()[c]) for c in COLUMNS] for r in results]
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def write_chart(results: Sequence[PolicyResult], path: str) -> Path:
    """Demand per model (requests a second) and ready replicas per model and policy,
    over time, into one PNG (matplotlib: a dev dependency)."""
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    first = results[0].timeline
    times = [sample.t for sample in first]
    models = sorted(first[0].demand) if first else []
    colour = {model: f"C{i}" for i, model in enumerate(models)}
    for model in models:
        series = [sample.demand[model] for sample in first]
        top.plot(times, series, color=colour[model], label=model)
    top.set_ylabel("requests / s")
    top.set_title("Demand")
    top.legend()
    for result in results:
        style = "--" if result.policy == "static" else "-"
        for model in models:
            series = [sample.replicas[model] for sample in result.timeline]
            label = f"{model}, {result.policy}"
            bottom.step(times, series, style, color=colour[model], where="post", label=label)
    bottom.set_ylabel("replicas ready")
    bottom.set_xlabel("seconds")
    bottom.legend(fontsize=8)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
