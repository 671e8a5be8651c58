"""`gateway eval run | report | compare | check-suite`: the command line of the evaluation."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.config.schema import OutboundPolicy

if TYPE_CHECKING:
    from gateway_tools.eval.tool_runner import ToolSettings

DEFAULT_SUITE = "evals/suites/gateway-python"
DEFAULT_PROFILES = "evals/profiles"
DEFAULT_REVIEWS = "evals/reviews"
KEY_ENV = "GATEWAY_EVAL_KEY"
ADMIN_KEY_ENV = "GATEWAY_EVAL_ADMIN_KEY"
TOOLS_BIN_ENV = "GATEWAY_TOOLS_BIN"
TOOL_NAMES = ("codex", "claude", "aider", "opencode")


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    """The `eval` sub-commands, on `parser`."""
    sub = parser.add_subparsers(dest="eval_command", required=True)

    run = sub.add_parser("run", help="run candidates on a task suite and record every attempt")
    run.add_argument(
        "--endpoint", required=True, help="base URL with /v1, e.g. http://127.0.0.1:8080/v1"
    )
    run.add_argument(
        "--key", help=f"API key, or - to read it from standard input (default: ${KEY_ENV})"
    )
    run.add_argument("--model", action="append", required=True, dest="models",
                     help="a candidate model; repeat for several")  # fmt: skip
    run.add_argument(
        "--suite", default=DEFAULT_SUITE, help=f"suite directory (default: {DEFAULT_SUITE})"
    )
    run.add_argument("--task", action="append", dest="tasks",
                     help="run only this task of the suite; repeat for several")  # fmt: skip
    run.add_argument("--attempts", type=int, default=1, help="attempts per candidate and task")
    run.add_argument("--out", required=True, help="run directory (an earlier run there is resumed)")
    run.add_argument("--concurrency", type=int, default=1, help="attempts in flight at once")
    run.add_argument("--api", choices=("chat", "responses"), default="chat")
    run.add_argument("--template", help="prompt template YAML (default: the shipped code-change)")
    run.add_argument("--temperature", type=float, default=0.0)
    run.add_argument("--max-tokens", type=int, default=2048)
    run.add_argument("--seed", type=int, default=1, help="attempt i is asked with seed + i")
    run.add_argument(
        "--max-retries", type=int, default=4, help="retries of a 429, 5xx or lost connection"
    )
    run.add_argument(
        "--test-timeout", type=float, default=60.0, help="seconds the hidden tests may take"
    )
    run.add_argument("--prices", help="prices YAML (gateway_tools/eval/pricing.py)")
    run.add_argument("--external", action="store_true",
                     help="the endpoint is outside the cluster: sanitize what is sent")  # fmt: skip
    run.add_argument("--outbound", choices=[p.value for p in OutboundPolicy], default="mask",
                     help="with --external: mask (default), block or off")  # fmt: skip
    run.add_argument("--internal-domain", action="append", default=[], dest="internal_domains",
                     help="with --external: an internal host-name suffix (repeat)")  # fmt: skip
    tools = run.add_argument_group(
        "coding tools", "run each --model by each real tool, attributed by the gateway"
    )
    tools.add_argument("--tool", action="append", dest="tools", choices=TOOL_NAMES,
                       help="a coding tool to run on each model; repeat for several")  # fmt: skip
    tools.add_argument("--tools-bin", default=os.environ.get(TOOLS_BIN_ENV),
                       help=f"the tools' commands (default: ${TOOLS_BIN_ENV}; "
                       "scripts/coding-tools.sh prints one)")  # fmt: skip
    tools.add_argument("--tenant", help="the tenant whose keys the tools' runs get")
    tools.add_argument("--admin-url", help="the gateway's admin API (its ops listener's URL)")
    tools.add_argument("--admin-key", default=os.environ.get(ADMIN_KEY_ENV),
                       help=f"an admin tenant's key (default: ${ADMIN_KEY_ENV})")  # fmt: skip
    tools.add_argument("--tool-timeout", type=float, default=600.0,
                       help="seconds one run of a tool may take (default 600)")  # fmt: skip
    run.set_defaults(run=_run)
    tools.add_argument(
        "--run-rpm", type=int, default=120,
        help="requests a minute one run's key may make (default 120; 0: the tenant's alone)",
    )  # fmt: skip

    report = sub.add_parser("report", help="Markdown report and charts of a run directory")
    report.add_argument("directory")
    report.add_argument(
        "--profiles", default=DEFAULT_PROFILES, help="profile YAML files' directory"
    )
    report.add_argument("--reviews", default=DEFAULT_REVIEWS, help="reviewer records' directory")
    report.set_defaults(run=_report)

    compare = sub.add_parser("compare", help="two runs side by side, if they are comparable")
    compare.add_argument("first")
    compare.add_argument("second")
    compare.add_argument(
        "--other-tool-versions",
        action="store_true",
        help="compare though a coding tool's version differs between the runs",
    )
    compare.set_defaults(run=_compare)

    check = sub.add_parser("check-suite", help="check that every task of a suite can judge answers")
    check.add_argument("suite", nargs="?", default=DEFAULT_SUITE)
    check.set_defaults(run=_check_suite)


def _run(args: argparse.Namespace) -> int:
    from gateway_tools.eval.client import Endpoint, Sampling
    from gateway_tools.eval.pricing import Prices, load_prices
    from gateway_tools.eval.prompt_template import DEFAULT_TEMPLATE, load_template
    from gateway_tools.eval.run_keys import AdminError
    from gateway_tools.eval.runner import TEST_LIMITS, RunRefused, RunSettings, run
    from gateway_tools.eval.sanitizing import Sanitizer
    from gateway_tools.eval.suite import SuiteError, load_suite

    key = sys.stdin.readline().strip() if args.key == "-" else args.key or os.environ.get(KEY_ENV)
    if not key and not args.tools:  # the tools' runs each get a key of their own
        print(f"eval run: no API key: give --key or set {KEY_ENV}", file=sys.stderr)
        return 2
    if args.attempts < 1 or args.concurrency < 1:
        print("eval run: --attempts and --concurrency must be at least 1", file=sys.stderr)
        return 2
    try:
        suite = load_suite(Path(args.suite))
        template = load_template(Path(args.template) if args.template else DEFAULT_TEMPLATE)
        prices = load_prices(Path(args.prices)) if args.prices else Prices()
    except (SuiteError, ValueError, OSError) as exc:
        print(f"eval run: {exc}", file=sys.stderr)
        return 2
    unknown = sorted(set(args.tasks or ()) - {task.id for task in suite.tasks})
    if unknown:
        print(f"eval run: no such tasks in {suite.name}: {', '.join(unknown)}", file=sys.stderr)
        return 2
    try:
        tools = _tool_settings(args)
    except ValueError as exc:
        print(f"eval run: {exc}", file=sys.stderr)
        return 2
    settings = RunSettings(
        endpoint=Endpoint(args.endpoint, key or "", api=args.api, max_retries=args.max_retries),
        candidates=tuple(dict.fromkeys(args.models)),
        suite=suite,
        tasks=tuple(args.tasks or ()),
        template=template,
        sampling=Sampling(args.temperature, args.max_tokens, args.seed),
        attempts=args.attempts,
        concurrency=args.concurrency,
        limits=dataclasses.replace(TEST_LIMITS, wall_s=args.test_timeout),
        prices=prices,
        sanitizer=Sanitizer(OutboundPolicy(args.outbound), tuple(args.internal_domains))
        if args.external
        else None,
        tools=tools,
        admin=(args.admin_url, args.admin_key) if tools is not None else None,
    )
    try:
        attempts = asyncio.run(run(settings, Path(args.out)))
    except RunRefused as exc:
        print(f"eval run: {exc}", file=sys.stderr)
        return 2
    except AdminError as exc:  # the gateway's admin API failed while the tools ran
        print(f"eval run: {exc}; finished attempts are kept in {args.out}: run the same "
              "command again to resume", file=sys.stderr)  # fmt: skip
        return 1
    except KeyboardInterrupt:
        print(f"\ninterrupted: finished attempts are kept in {args.out}; run the same command "
              "again to resume", file=sys.stderr)  # fmt: skip
        return 130
    passed = sum(a.passed for a in attempts)
    print(f"{passed} of {len(attempts)} attempts passed; results in {args.out}", file=sys.stderr)
    return 0


def _tool_settings(args: argparse.Namespace) -> ToolSettings | None:
    """The `--tool` options, checked; None without `--tool`."""
    from gateway_tools.eval.tool_runner import TOOL_LIMITS, ToolSettings

    if not args.tools:
        return None
    missing = [
        flag
        for flag, value in (("--tools-bin", args.tools_bin), ("--tenant", args.tenant),
                            ("--admin-url", args.admin_url), ("--admin-key", args.admin_key))
        if not value
    ]  # fmt: skip
    if missing:
        raise ValueError(f"--tool needs {', '.join(missing)}")
    if args.tool_timeout <= 0:
        raise ValueError("--tool-timeout must be above 0")
    if args.run_rpm < 0:
        raise ValueError("--run-rpm must be 0 (no cap) or more")
    bin_dir = Path(args.tools_bin).resolve()
    if not bin_dir.is_dir():
        raise ValueError(f"--tools-bin {args.tools_bin}: not a directory")
    limits = dataclasses.replace(TOOL_LIMITS, wall_s=args.tool_timeout)
    rpm = args.run_rpm or None
    return ToolSettings(tuple(dict.fromkeys(args.tools)), bin_dir, args.tenant, limits, rpm)


def _report(args: argparse.Namespace) -> int:
    from gateway_tools.eval.reporting import write_report

    profiles_dir, reviews = Path(args.profiles), Path(args.reviews)
    profiles = sorted(profiles_dir.glob("*.yaml")) if profiles_dir.is_dir() else []
    try:
        path = write_report(Path(args.directory), profiles, reviews if reviews.is_dir() else None)
    except (ValueError, OSError) as exc:
        print(f"eval report: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


def _compare(args: argparse.Namespace) -> int:
    from gateway_tools.eval.compare import NotComparable, compare

    try:
        print(compare(Path(args.first), Path(args.second),
                      other_tool_versions=args.other_tool_versions))  # fmt: skip
    except NotComparable as exc:
        print(f"eval compare: {exc}", file=sys.stderr)
        return 1
    except (ValueError, OSError) as exc:
        print(f"eval compare: {exc}", file=sys.stderr)
        return 2
    return 0


def _check_suite(args: argparse.Namespace) -> int:
    from gateway_tools.eval.judge import verify
    from gateway_tools.eval.runner import TEST_LIMITS
    from gateway_tools.eval.sandbox import SandboxUnavailable
    from gateway_tools.eval.suite import SuiteError, load_suite

    try:
        suite = load_suite(Path(args.suite))
    except SuiteError as exc:
        print(f"check-suite: {exc}", file=sys.stderr)
        return 2
    bad = 0
    for task in suite.tasks:
        try:
            problem = verify(task, TEST_LIMITS)
        except SandboxUnavailable as exc:  # no sandbox: nothing is run without one
            print(f"check-suite: {exc}", file=sys.stderr)
            return 2
        bad += problem is not None
        print(f"{task.id}: {problem or 'ok'} ({task.category}, {task.kind})")
    good = len(suite.tasks) - bad
    print(f"{suite.name} v{suite.version}: {good} of {len(suite.tasks)} tasks ok; "
          f"digest {suite.digest[:12]}")  # fmt: skip
    return 1 if bad else 0
