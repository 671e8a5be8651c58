"""`gateway place`: where cluster.yaml's model replicas go; with --apply, put them there."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from gateway.config.source import ConfigError


def add_place_arguments(place: argparse.ArgumentParser) -> None:
    """The options of `gateway place`."""
    place.add_argument("--config", required=True, help="path of cluster.yaml")
    place.add_argument(
        "--down", action="append", default=[], metavar="NODE", help="a node to leave out"
    )
    place.add_argument("--json", action="store_true", help="print the plan as JSON")
    place.add_argument(
        "--apply",
        action="store_true",
        help="load and unload models on each node's Triton (repository API) to match",
    )


def run_place_command(args: argparse.Namespace) -> int:
    """Plan the placement, print it, and apply it when asked."""
    from gateway_control.cluster_config import load_cluster
    from gateway_control.placement.deployment import plan_deployments

    try:
        cluster = load_cluster(args.config)
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 1
    unknown = sorted(set(args.down) - {n.name for n in cluster.nodes})
    if unknown:
        print(f"place: --down names unknown nodes: {', '.join(unknown)}", file=sys.stderr)
        return 2
    plan = plan_deployments(cluster, down=args.down)
    if args.json:
        print(
            json.dumps(
                {
                    "placements": [
                        {"model": p.model, "replica": p.index, "node": p.node, "gpus": p.gpus}
                        for p in plan.placements
                    ],
                    "unplaced": plan.unplaced,
                }
            )
        )
    else:
        for p in plan.placements:
            gpus = ",".join(map(str, p.gpus)) or "-"
            print(f"{p.model}#{p.index}  {p.node}  gpus {gpus}")
        for model, count in sorted(plan.unplaced.items()):
            print(f"{model}: {count} replica(s) fit nowhere")
    if args.apply:
        import aiohttp

        from gateway_control.placement.triton_repository import RepositoryError, apply_plan

        up = [n.name for n in cluster.nodes if n.name not in args.down]
        try:
            actions = asyncio.run(apply_plan(cluster, plan, nodes=up))
        except (RepositoryError, aiohttp.ClientError, OSError) as exc:
            print(f"place: {exc}", file=sys.stderr)
            return 1
        for action in actions:
            print(action, file=sys.stderr if args.json else sys.stdout)
    return 1 if plan.unplaced else 0
