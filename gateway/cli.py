"""The `gateway` command: the server's sub-commands (serve | check-config | keys | hash-key),
and those the other installed programs add (gateway_control: place | simulate;
gateway_tools: demo | triton-sim | usage | eval | tools), found by entry point so that
`gateway serve` loads nothing of them."""

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
    from gateway.config import (
        ConfigError,
        environment_problems,
        environment_warnings,
        load_config,
    )
    from gateway.config.demo_keys import published_keys_served
    from gateway.observability import trace_settings
    from gateway.observability.logging import configure_logging
    from gateway.transport.protocol import GuardedHttpToolsProtocol

    configure_logging()
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 1
    try:
        trace_settings.settings(config.gateway.tracing.model_dump(exclude_none=True), os.environ)
    except trace_settings.TracingError as exc:
        print(exc, file=sys.stderr)
        return 1
    missing = environment_problems(args.config)
    if missing:
        print("\n".join(missing), file=sys.stderr)
        return 1
    for warning in environment_warnings(args.config):
        print(f"warning: {warning} (the gateway serves without that server)", file=sys.stderr)
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
    hosts = [args.host or server.host]
    if server.ops.port is not None:
        hosts.append(server.ops.host)
    exposed = published_keys_served(config, hosts)
    if exposed is not None:
        print(exposed, file=sys.stderr)
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
    if not problems:
        problems = _environment_problems(args.config)
    for problem in problems:
        print(problem)
    if problems:
        return 1
    for warning in _environment_warnings(args.config):
        print(f"warning: {warning} (the gateway serves without that server)", file=sys.stderr)
    print(f"{args.config}: ok")
    return 0


def _environment_warnings(path: str) -> list[str]:
    """What of gateway.yaml cannot run here but does not stop it (a bare tenants file
    has none)."""
    from gateway.config.loader import environment_warnings, is_tenants_file
    from gateway.config.source import read_source

    return [] if is_tenants_file(read_source(path).data) else environment_warnings(path)


def _environment_problems(path: str) -> list[str]:
    """What `gateway serve` would refuse in this environment beside the files: the
    tracing settings it reads from `OTEL_*` (a bare tenants file reads none)."""
    from gateway.config import environment_problems, load_config
    from gateway.config.loader import is_tenants_file
    from gateway.config.source import read_source
    from gateway.observability import trace_settings

    if is_tenants_file(read_source(path).data):
        return []
    config = load_config(path)
    try:
        trace_settings.settings(config.gateway.tracing.model_dump(exclude_none=True), os.environ)
    except trace_settings.TracingError as exc:
        return [f"environment: {exc}"]
    return environment_problems(path)


def _hash_key(args: argparse.Namespace) -> int:
    from gateway.config import hash_key

    key = sys.stdin.readline().strip() if args.key == "-" else args.key
    if not key:
        print("hash-key: empty key", file=sys.stderr)
        return 2
    print(hash_key(key))
    return 0


# The server's own sub-commands: for these, no other program's commands are loaded.
SERVING_COMMANDS = frozenset({"serve", "check-config", "keys", "batches", "mcp", "hash-key"})
COMMANDS_GROUP = "inference_gateway.commands"


def _add_other_programs(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The sub-commands of the other installed programs (a program left out of an
    install, as the image leaves out the tools, adds none)."""
    from gateway.config.extensions import installed_parts

    for add_commands in installed_parts(COMMANDS_GROUP):
        add_commands(sub)


def parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The command line, with one sub-command per job (only the server's when `argv`
    names one of them)."""
    top = argparse.ArgumentParser(prog="gateway", description=__doc__)
    sub = top.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", required=True, help="path of gateway.yaml")
    serve.add_argument("--host", help="bind address (default: server.host in the config)")
    serve.add_argument("--port", type=int, help="port (default: server.port in the config)")
    serve.add_argument("--workers", type=int, default=1, help="worker processes")
    serve.set_defaults(run=_serve)

    check = sub.add_parser(
        "check-config", help="validate gateway.yaml (and its tenants) or tenants.yaml"
    )
    check.add_argument("--config", required=True)
    check.set_defaults(run=_check_config)

    from gateway.apikeys.keys_cli import add_keys_arguments

    keys = sub.add_parser(
        "keys", help="managed API keys: create, list, get, update, revoke, rotate"
    )
    add_keys_arguments(keys)

    from gateway.batches.batches_cli import add_batches_arguments

    batches = sub.add_parser("batches", help="every tenant's batches: list, get, cancel")
    add_batches_arguments(batches)

    from gateway.mcp.mcp_cli import add_mcp_arguments

    mcp = sub.add_parser("mcp", help="MCP tools held from clients: held, accept")
    add_mcp_arguments(mcp)

    hash_key = sub.add_parser("hash-key", help="print the stored form of an API key")
    hash_key.add_argument("key", help="the key, or - to read it from standard input")
    hash_key.set_defaults(run=_hash_key)

    words = sys.argv[1:] if argv is None else argv
    if not words or words[0] not in SERVING_COMMANDS:
        _add_other_programs(sub)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sub-command `argv` (default: the process's arguments) names."""
    args = parser(argv).parse_args(argv)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
