"""The `gateway` command: serve | demo | check-config | place | simulate | triton-sim | hash-key."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from gateway.api.protocol import GuardedHttpToolsProtocol
    from gateway.app import CONFIG_ENV
    from gateway.config import ConfigError, load_config
    from gateway.observability.logging import configure_logging

    configure_logging()
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 1
    # Workers are separate processes: they find the config through the environment.
    os.environ[CONFIG_ENV] = os.path.abspath(args.config)
    if args.workers > 1:
        # Each worker writes its metrics to files here; /metrics adds them up.
        os.environ.setdefault(
            "PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="gateway-metrics-")
        )
    # The files an earlier run left there would be added in, also in the operator's dir.
    from gateway.observability.metrics import clear_multiprocess_dir

    clear_multiprocess_dir(keep_own=args.workers == 1)
    uvicorn.run(
        "gateway.app:app_from_env",
        factory=True,
        host=args.host or config.gateway.server.host,
        port=args.port or config.gateway.server.port,
        workers=args.workers,
        loop="uvloop",
        # httptools, with limits against clients that never finish (gateway.api.protocol).
        http=GuardedHttpToolsProtocol,
        timeout_keep_alive=config.gateway.server.keepalive_timeout_s,
        access_log=False,
        log_config=None,
        timeout_graceful_shutdown=int(config.gateway.server.shutdown_grace_s),
    )
    return 0


def _check_config(args: argparse.Namespace) -> int:
    from gateway.config import check_config

    problems = check_config(args.config)
    for problem in problems:
        print(problem)
    if problems:
        return 1
    print(f"{args.config}: ok")
    return 0


def _hash_key(args: argparse.Namespace) -> int:
    from gateway.config import hash_key

    key = sys.stdin.readline().strip() if args.key == "-" else args.key
    if not key:
        print("hash-key: empty key", file=sys.stderr)
        return 2
    print(hash_key(key))
    return 0


def _triton_sim(args: argparse.Namespace) -> int:
    from gateway.dev.sim.server import run_triton_sim

    code: int = run_triton_sim(args.port, args.models)
    return code


def _demo(args: argparse.Namespace) -> int:
    from gateway.dev.demo import run_demo

    code: int = run_demo(port=args.port, config_path=args.config)
    return code


def _place(args: argparse.Namespace) -> int:
    from gateway.placement.place_cli import run_place_command

    return run_place_command(args)


def _simulate_packing(args: argparse.Namespace) -> int:
    from gateway.scheduler.experiments.packing_cli import run_packing_command

    return run_packing_command(args)


def _simulate_queue(args: argparse.Namespace) -> int:
    from gateway.scheduler.experiments.queue_cli import run_queue_command

    return run_queue_command(args)


def _simulate_trace(args: argparse.Namespace) -> int:
    from gateway.scheduler.experiments.queue_cli import run_trace_command

    return run_trace_command(args)


def parser() -> argparse.ArgumentParser:
    """The command line, with one sub-command per job."""
    top = argparse.ArgumentParser(prog="gateway", description=__doc__)
    sub = top.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", required=True, help="path of gateway.yaml")
    serve.add_argument("--host", help="bind address (default: server.host in the config)")
    serve.add_argument("--port", type=int, help="port (default: server.port in the config)")
    serve.add_argument("--workers", type=int, default=1, help="worker processes")
    serve.set_defaults(run=_serve)

    demo = sub.add_parser("demo", help="run local Triton replicas, Redis and the gateway")
    demo.add_argument("--port", type=int, default=8080)
    demo.add_argument(
        "--config",
        default="config/gateway.yaml",
        help="gateway.yaml to run (default: config/gateway.yaml, from the current directory "
        "or else from the source tree); checked before anything starts",
    )
    demo.set_defaults(run=_demo)

    check = sub.add_parser(
        "check-config", help="validate gateway.yaml (and its tenants) or tenants.yaml"
    )
    check.add_argument("--config", required=True)
    check.set_defaults(run=_check_config)

    sim = sub.add_parser("triton-sim", help="serve simulated LLMs from a real tritonserver")
    sim.add_argument("--port", type=int, required=True, help="HTTP port; gRPC is +1, metrics +2")
    sim.add_argument(
        "--models",
        default="llm-large,llm-small",
        help="comma-separated names; NAME=MS sets the per-token delay in milliseconds",
    )
    sim.set_defaults(run=_triton_sim)

    from gateway.placement.place_cli import add_place_arguments

    place = sub.add_parser("place", help="place cluster.yaml's model replicas on its nodes")
    add_place_arguments(place)
    place.set_defaults(run=_place)

    hash_key = sub.add_parser("hash-key", help="print the stored form of an API key")
    hash_key.add_argument("key", help="the key, or - to read it from standard input")
    hash_key.set_defaults(run=_hash_key)

    from gateway.scheduler.experiments.packing_cli import add_packing_arguments

    simulate = sub.add_parser("simulate", help="offline scheduler experiments")
    experiments = simulate.add_subparsers(dest="experiment", required=True)
    packing = experiments.add_parser("packing", help="GPU packing on the openb trace")
    add_packing_arguments(packing)
    packing.set_defaults(run=_simulate_packing)
    from gateway.scheduler.experiments.queue_cli import add_queue_arguments, add_trace_arguments

    queue = experiments.add_parser(
        "queue", help="replay a job trace: quotas, fair share, preemption, failures"
    )
    add_queue_arguments(queue)
    queue.set_defaults(run=_simulate_queue)
    trace = experiments.add_parser("trace", help="derive a job trace from the openb pod list")
    add_trace_arguments(trace)
    trace.set_defaults(run=_simulate_trace)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
