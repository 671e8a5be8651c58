"""The `gateway` command: serve | demo | check-config | place | usage | keys | eval | simulate |
triton-sim | hash-key."""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
import tempfile
from collections.abc import Sequence


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from gateway.app import CONFIG_ENV
    from gateway.config import ConfigError, load_config
    from gateway.observability.logging import configure_logging
    from gateway.transport.protocol import GuardedHttpToolsProtocol

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
    server = config.gateway.server
    port = args.port or server.port
    if server.ops.port == port:
        print(f"server.ops.port {port} is the API port: choose another", file=sys.stderr)
        return 1
    settings = uvicorn.Config(
        "gateway.app:app_from_env",
        factory=True,
        host=args.host or server.host,
        port=port,
        workers=args.workers,
        loop="uvloop",
        # httptools, with limits against clients that never finish (gateway.transport.protocol).
        http=GuardedHttpToolsProtocol,
        # No WebSocket: an upgraded connection would leave the guarded protocol (and its
        # connection counts) behind.
        ws="none",
        timeout_keep_alive=server.keepalive_timeout_s,
        # X-Forwarded-For names the client only when a trusted proxy sent it (uvicorn's
        # own default trusts 127.0.0.1, where any local process could claim any address).
        proxy_headers=bool(server.trusted_proxies),
        forwarded_allow_ips=[str(network) for network in server.trusted_proxies],
        access_log=False,
        log_config=None,
        timeout_graceful_shutdown=int(server.shutdown_grace_s),
    )
    # Every worker serves both sockets: the API and, if configured, the ops listener
    # (gateway.transport.listeners tells their requests apart).
    sockets = [settings.bind_socket()]
    if server.ops.port is not None:
        sockets.append(_ops_socket(server.ops.host, server.ops.port))
    if args.workers > 1:
        from uvicorn.supervisors import Multiprocess

        Multiprocess(settings, sockets=sockets).run()
        return 0
    single = uvicorn.Server(settings)
    with contextlib.suppress(KeyboardInterrupt):
        single.run(sockets=sockets)
    return 0 if single.started else 3  # uvicorn's exit status for a failed startup


def _ops_socket(host: str, port: int) -> socket.socket:
    """The ops listener's socket, bound as uvicorn binds the API's."""
    import logging

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise SystemExit(f"server.ops: cannot listen on {host}:{port}: {exc.strerror}") from exc
    sock.set_inheritable(True)
    logging.getLogger("gateway").info("ops listener (metrics, admin) on %s:%d", host, port)
    return sock


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


def _tools_config(args: argparse.Namespace) -> int:
    from pathlib import Path

    from gateway.clients.tool_config import config_for

    if args.tool_default and args.model is not None:
        print("tools config: --model and --tool-default-model exclude each other", file=sys.stderr)
        return 2
    model = None if args.tool_default else (args.model or "llm-large")
    try:
        config = config_for(args.tool, args.url, args.key, model)
    except ValueError as exc:
        print(f"tools config: {exc}", file=sys.stderr)
        return 2
    if args.write_home is not None:
        if not config.files:
            print(f"tools config: {args.tool} has no files: its configuration is the "
                  "environment below", file=sys.stderr)  # fmt: skip
        try:
            written = config.write(Path(args.write_home), replace=args.force)
        except FileExistsError as exc:
            print(f"tools config: {exc}; --force replaces it", file=sys.stderr)
            return 2
        for path in written:
            print(f"wrote {path}", file=sys.stderr)
    print(config.render(), end="")
    return 0


def _triton_sim(args: argparse.Namespace) -> int:
    from gateway.dev.sim.server import run_triton_sim

    code: int = run_triton_sim(args.port, args.models)
    return code


def _demo(args: argparse.Namespace) -> int:
    from gateway.dev.demo import run_demo

    code: int = run_demo(port=args.port, config_path=args.config, ops_port=args.ops_port)
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


def _simulate_autoscale(args: argparse.Namespace) -> int:
    from gateway.placement.autoscale_cli import run_autoscale_command

    return run_autoscale_command(args)


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
        "--ops-port", type=int, help="the ops listener's port (default: the config's, 8081)"
    )
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

    from gateway.ledger.usage_cli import add_usage_arguments

    usage = sub.add_parser("usage", help="usage and cost from the ledger: report")
    add_usage_arguments(usage)

    from gateway.apikeys.keys_cli import add_keys_arguments

    keys = sub.add_parser(
        "keys", help="managed API keys: create, list, get, update, revoke, rotate"
    )
    add_keys_arguments(keys)

    from gateway.eval.eval_cli import add_eval_arguments

    evaluate = sub.add_parser("eval", help="evaluate models on a task suite: run, report, compare")
    add_eval_arguments(evaluate)

    from gateway.clients.tool_config import KEY_PLACEHOLDER, TOOLS

    tools = sub.add_parser("tools", help="coding tools as clients of the gateway")
    tool_commands = tools.add_subparsers(dest="tools_command", required=True)
    tool_config = tool_commands.add_parser(
        "config", help="print the files and environment that point a tool at the gateway"
    )
    tool_config.add_argument("tool", choices=sorted(TOOLS))
    tool_config.add_argument("--url", default="http://127.0.0.1:8080", help="the gateway")
    tool_config.add_argument(
        "--key", default=KEY_PLACEHOLDER, help="a tenant's key (default: a placeholder)"
    )
    tool_config.add_argument(
        "--model", help="the model the tool asks for (default: llm-large, the demo's)"
    )
    tool_config.add_argument(
        "--tool-default-model",
        dest="tool_default",
        action="store_true",
        help="name no model: the tool asks for its own default, which the gateway's aliases "
        "route (Codex CLI, Claude Code)",
    )
    tool_config.add_argument(
        "--write-home", metavar="DIR", help="also write the tool's files under this home"
    )
    tool_config.add_argument(
        "--force", action="store_true", help="with --write-home: replace files that differ"
    )
    tool_config.set_defaults(run=_tools_config)

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
    from gateway.placement.autoscale_cli import add_autoscale_arguments

    autoscale = experiments.add_parser(
        "autoscale", help="static placement against the closed loop on a shifting trace"
    )
    add_autoscale_arguments(autoscale)
    autoscale.set_defaults(run=_simulate_autoscale)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
