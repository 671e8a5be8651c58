"""The offline tools' sub-commands of `gateway`: demo | triton-sim | usage | eval | tools.
`gateway.cli` finds `add_commands` by its entry point."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    Commands = argparse._SubParsersAction[argparse.ArgumentParser]


def _tools_config(args: argparse.Namespace) -> int:
    from pathlib import Path

    from gateway_tools.clients.tool_config import config_for

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
    from gateway_tools.dev.sim.server import run_triton_sim

    code: int = run_triton_sim(args.port, args.models, args.trace_url)
    return code


def _otlp_receiver(args: argparse.Namespace) -> int:
    from gateway_tools.dev.otlp_receiver import run_receiver

    return run_receiver(args.port, args.grpc_port, args.file)


def _traces(args: argparse.Namespace) -> int:
    from gateway_tools.dev.trace_view import run_traces

    return run_traces(args.file, args.trace, args.request_id, args.last, args.all)


def _demo(args: argparse.Namespace) -> int:
    from gateway_tools.dev.demo import run_demo

    code: int = run_demo(port=args.port, config_path=args.config, ops_port=args.ops_port)
    return code


def add_commands(sub: Commands) -> None:
    """Add the offline tools' sub-commands to the `gateway` command line."""
    demo = sub.add_parser("demo", help="run local Triton replicas, Redis and the gateway")
    demo.add_argument("--port", type=int, default=8080, help="the gateway's API port (8080)")
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

    sim = sub.add_parser("triton-sim", help="serve simulated LLMs from a real tritonserver")
    sim.add_argument("--port", type=int, required=True, help="HTTP port; gRPC is +1, metrics +2")
    sim.add_argument(
        "--models",
        default="llm-large,llm-small",
        help="comma-separated names; NAME=MS sets the per-token delay in milliseconds, "
        "NAME=@FILE replays recorded answers, NAME:vllm or NAME:tensorrtllm takes that "
        "backend's inputs (docs/triton-sim.md)",
    )
    sim.add_argument(
        "--trace-url",
        help="send tritonserver's OpenTelemetry spans (of requests that come with a "
        "traceparent) to this OTLP/HTTP endpoint, e.g. http://127.0.0.1:4318/v1/traces",
    )
    sim.set_defaults(run=_triton_sim)

    receiver = sub.add_parser(
        "otlp-receiver", help="receive OTLP spans (HTTP, gRPC) into a file for `gateway traces`"
    )
    receiver.add_argument("--port", type=int, default=4318, help="OTLP/HTTP port (4318)")
    receiver.add_argument("--grpc-port", type=int, help="OTLP/gRPC port (none unless given)")
    receiver.add_argument("--file", help="append spans here, one JSON line each")
    receiver.set_defaults(run=_otlp_receiver)

    traces = sub.add_parser(
        "traces", help="print traces the demo received as waterfalls (docs/observability.md)"
    )
    traces.add_argument(
        "--file",
        default=os.path.join(os.environ.get("GATEWAY_STATE_DIR", "."), "traces.jsonl"),
        help="the spans file (default: $GATEWAY_STATE_DIR/traces.jsonl, as the demo writes it)",
    )
    traces.add_argument("--trace", help="a trace id (or its first characters)")
    traces.add_argument("--request-id", help="the request's x-request-id")
    traces.add_argument("--last", type=int, default=1, help="the last N requests' traces (1)")
    traces.add_argument(
        "--all",
        action="store_true",
        help="with --last: the gateway's own work too (placements, the closed loop)",
    )
    traces.set_defaults(run=_traces)

    from gateway_tools.usage_cli import add_usage_arguments

    usage = sub.add_parser("usage", help="usage and cost from the ledger: report")
    add_usage_arguments(usage)

    from gateway_tools.eval.eval_cli import add_eval_arguments

    evaluate = sub.add_parser("eval", help="evaluate models on a task suite: run, report, compare")
    add_eval_arguments(evaluate)

    from gateway_tools.clients.tool_config import KEY_PLACEHOLDER, TOOLS

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
