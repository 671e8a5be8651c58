"""The packing results table of docs/scheduler.md in one command.

    .venv/bin/python -m loadtest.packing_table --data /path/to/openb [--jobs 2]

For each workload (the default pod list, then the families of
`gateway_control.scheduler.experiments.workloads` derived from it) and each policy, runs the packing
experiment once per seed and prints a Markdown table: median over the seeds of the unallocated GPU %
at 100 % arrived, its range, the paper's value where it has one, and the mean time per
placement. `--write DIR` also writes each derived family as an openb pod list, for
`gateway simulate packing --pods DIR/<family>.csv`. The trace stays where it is: only
its path is read.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from functools import cache
from pathlib import Path

from gateway_control.scheduler.cluster import Node, Pod, load_nodes, load_pods
from gateway_control.scheduler.experiments.packing import run_packing
from gateway_control.scheduler.experiments.workloads import derive, family_names, write_pods
from gateway_control.scheduler.policies.registry import POLICY_NAMES

NODES_CSV = "openb_node_list_gpu_node.csv"
PODS_CSV = "openb_pod_list_default.csv"
FAMILY_SEED = 0  # one fixed file per family, like the paper's; the run seeds vary
DEFAULT_POLICIES = ("random", "best-fit", "first-fit", "fgd", "fgd-plus", "topology")
# The paper's medians (unallocated GPU % at 100 % arrived), default workload only.
DASH = "\u2013"  # the en dash of docs/scheduler.md
PAPER = {("default", "random"): 13.75, ("default", "best-fit"): 7.09, ("default", "fgd"): 4.77}


@cache
def workload(data: str, family: str) -> tuple[tuple[Node, ...], tuple[Pod, ...]]:
    """The node list and the pods of `family` ("default" or a derived family name)."""
    nodes = load_nodes(Path(data) / NODES_CSV)
    pods = load_pods(Path(data) / PODS_CSV)
    if family != "default":
        pods = derive(family, pods, nodes, FAMILY_SEED)
    return tuple(nodes), tuple(pods)


def one_run(data: str, family: str, policy: str, seed: int) -> tuple[float, float]:
    """Unallocated GPU % at 100 % arrived, and microseconds per placement, of one run."""
    nodes, pods = workload(data, family)
    result = run_packing(nodes, pods, policy, seed)
    return 100 - result.allocated_gpu_pct[100], 1e6 * result.placement_seconds / result.pods


def seed_range(text: str) -> list[int]:
    """`42-51` or `1,2,5` -> the seeds."""
    if "-" in text:
        low, high = text.split("-", 1)
        return list(range(int(low), int(high) + 1))
    return [int(s) for s in text.split(",")]


def table(
    data: str, families: Sequence[str], policies: Sequence[str], seeds: Sequence[int], jobs: int
) -> str:
    """Run everything (over `jobs` processes) and format the Markdown table."""
    tasks = [(f, p, s) for f in families for p in policies for s in seeds]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(one_run, data, *task) for task in tasks]
        results = dict(zip(tasks, (f.result() for f in futures), strict=True))
    lines = [
        "| workload | policy | unallocated GPU % (median) | range over seeds | paper "
        "| time per placement |",
        "|---|---|---|---|---|---|",
    ]
    for family in families:
        for policy in policies:
            runs = [results[(family, policy, s)] for s in seeds]
            unallocated = [u for u, _ in runs]
            paper = PAPER.get((family, policy))
            lines.append(
                f"| {family} | {policy} | {statistics.median(unallocated):.2f} "
                f"| {min(unallocated):.2f}{DASH}{max(unallocated):.2f} "
                f"| {DASH if paper is None else f'{paper:.2f}'} "
                f"| {statistics.mean(us for _, us in runs):.0f} µs |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the options, optionally write the families, print the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--data", required=True, help="directory holding the openb CSVs")
    parser.add_argument(
        "--families",
        default=",".join(["default", *family_names()]),
        help="comma-separated: default and/or gpushareNN, multigpuNN, gpuspecNN",
    )
    parser.add_argument("--policies", default=",".join(DEFAULT_POLICIES))
    parser.add_argument("--seeds", default="42-51", help="e.g. 42-51 or 1,2,3")
    parser.add_argument("--jobs", type=int, default=1, help="parallel processes")
    parser.add_argument("--write", metavar="DIR", help="also write each family's pod list")
    args = parser.parse_args(argv)
    families = args.families.split(",")
    policies = args.policies.split(",")
    unknown = sorted(set(policies) - set(POLICY_NAMES))
    if unknown:
        parser.error(f"unknown policies {unknown}; choose from {', '.join(POLICY_NAMES)}")
    if args.write:
        out = Path(args.write)
        out.mkdir(parents=True, exist_ok=True)
        for family in families:
            if family != "default":
                write_pods(out / f"{family}.csv", workload(args.data, family)[1])
    print(table(args.data, families, policies, seed_range(args.seeds), args.jobs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
