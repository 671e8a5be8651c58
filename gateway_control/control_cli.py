"""The control plane's sub-commands of `gateway`: place | simulate (packing, queue, trace,
autoscale). `gateway.cli` finds `add_commands` by its entry point."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    Commands = argparse._SubParsersAction[argparse.ArgumentParser]


def _place(args: argparse.Namespace) -> int:
    from gateway_control.placement.place_cli import run_place_command

    return run_place_command(args)


def _simulate_packing(args: argparse.Namespace) -> int:
    from gateway_control.scheduler.experiments.packing_cli import run_packing_command

    return run_packing_command(args)


def _simulate_queue(args: argparse.Namespace) -> int:
    from gateway_control.scheduler.experiments.queue_cli import run_queue_command

    return run_queue_command(args)


def _simulate_autoscale(args: argparse.Namespace) -> int:
    from gateway_control.placement.autoscale_cli import run_autoscale_command

    return run_autoscale_command(args)


def _simulate_trace(args: argparse.Namespace) -> int:
    from gateway_control.scheduler.experiments.queue_cli import run_trace_command

    return run_trace_command(args)


def add_commands(sub: Commands) -> None:
    """Add the control plane's sub-commands to the `gateway` command line."""
    from gateway_control.placement.place_cli import add_place_arguments

    place = sub.add_parser("place", help="place cluster.yaml's model replicas on its nodes")
    add_place_arguments(place)
    place.set_defaults(run=_place)

    from gateway_control.scheduler.experiments.packing_cli import add_packing_arguments

    simulate = sub.add_parser("simulate", help="offline scheduler experiments")
    experiments = simulate.add_subparsers(dest="experiment", required=True)
    packing = experiments.add_parser("packing", help="GPU packing on the openb trace")
    add_packing_arguments(packing)
    packing.set_defaults(run=_simulate_packing)
    from gateway_control.scheduler.experiments.queue_cli import (
        add_queue_arguments,
        add_trace_arguments,
    )

    queue = experiments.add_parser(
        "queue", help="replay a job trace: quotas, fair share, preemption, failures"
    )
    add_queue_arguments(queue)
    queue.set_defaults(run=_simulate_queue)
    trace = experiments.add_parser("trace", help="derive a job trace from the openb pod list")
    add_trace_arguments(trace)
    trace.set_defaults(run=_simulate_trace)
    from gateway_control.placement.autoscale_cli import add_autoscale_arguments

    autoscale = experiments.add_parser(
        "autoscale", help="static placement against the closed loop on a shifting trace"
    )
    add_autoscale_arguments(autoscale)
    autoscale.set_defaults(run=_simulate_autoscale)
