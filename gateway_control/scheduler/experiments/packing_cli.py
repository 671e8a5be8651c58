"""`gateway simulate packing`: the fragmentation packing experiment from the command line."""

from __future__ import annotations

import argparse
import json
import sys

from gateway_control.scheduler.cluster import load_nodes, load_pods
from gateway_control.scheduler.experiments.packing import run_packing
from gateway_control.scheduler.policies.registry import BEST_POLICY, POLICY_NAMES


def add_packing_arguments(packing: argparse.ArgumentParser) -> None:
    """The options of `simulate packing`."""
    packing.add_argument("--nodes", required=True, help="openb node list CSV")
    packing.add_argument("--pods", required=True, help="openb pod list CSV")
    packing.add_argument(
        "--policy",
        choices=POLICY_NAMES,
        default=BEST_POLICY,
        help=f"placement policy (default: {BEST_POLICY}, the best one)",
    )
    packing.add_argument("--seed", type=int, required=True, help="workload and policy seed")
    packing.add_argument("--json", action="store_true", help="print the result as JSON")


def run_packing_command(args: argparse.Namespace) -> int:
    """Run one packing experiment and print it: JSON, or a one-line summary."""
    try:
        nodes = load_nodes(args.nodes)
        pods = load_pods(args.pods)
    except (OSError, KeyError, ValueError) as exc:
        print(f"simulate packing: {exc}", file=sys.stderr)
        return 2
    result = run_packing(nodes, pods, args.policy, args.seed)
    if args.json:
        print(json.dumps(result.to_json()))
        return 0
    at_100 = result.allocated_gpu_pct[min(100, len(result.allocated_gpu_pct) - 1)]
    print(
        f"{result.policy} seed {result.seed}: {result.total_gpus} GPUs, "
        f"unallocated at 100% arrived {100 - at_100:.2f}%, "
        f"{result.failed}/{result.pods} pods failed, "
        f"{1e6 * result.placement_seconds / max(result.pods, 1):.0f} us per placement"
    )
    return 0
