"""`gateway eval run --tool NAME`: the real coding tool at each task, through the gateway.

One attempt of a (tool, model) pair at a task (docs/eval.md, "Coding tools"):

1. a key of the run's own for the model (`run_keys.py`);
2. the tool, configured by `gateway tools config`'s code for that key and model, run
   once without a terminal on a fresh copy of the task's snapshot, in the sandbox, the
   gateway its only way out (`tool_sandbox.py`), up to the time limit;
3. the key revoked, and what the tool left in the task directory judged by the hidden
   tests, as a model's answer is;
4. its model calls read back from the gateway's usage ledger under the key: calls,
   tokens (cached ones too), cost at the run's prices, each call's status, time to first
   token and fallback.

What goes wrong is the attempt's `reason`, never the run's end: `tool:` (not installed,
stopped at the time limit, out of memory, left too much), then the hidden tests' verdict.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway_tools.clients.tool_config import batch_command, config_for
from gateway_tools.eval import judge, sandbox
from gateway_tools.eval.pricing import Prices
from gateway_tools.eval.records import Attempt, Call
from gateway_tools.eval.run_keys import Admin
from gateway_tools.eval.suite import Task
from gateway_tools.eval.tool_sandbox import HOME, INSIDE_HOST, TOOL_LIMITS, GatewayBridge, run_tool

__all__ = ["TOOL_LIMITS", "ToolSettings", "candidate_name", "tool_attempt", "tool_versions"]

# A run's key outlives its time limit by this much: the ledger's last records and the
# revoke come after the tool's exit.
KEY_GRACE_S = 300.0
_REFUSED = (429, 503)


@dataclass(frozen=True, slots=True)
class ToolSettings:
    """What `--tool` runs need besides the run's own settings."""

    tools: tuple[str, ...]
    # A directory whose `bin/` holds the tools' commands (`scripts/coding-tools.sh`
    # prints one); all of it is mounted read-only in the sandbox.
    tools_bin: Path
    tenant: str  # whose keys the runs get
    limits: sandbox.Limits = TOOL_LIMITS
    # Each run's key's own cap (None: the tenant's limits alone): a tool that loops is
    # refused past it, and cannot take the tenant's whole budget from the other runs.
    requests_per_minute: int | None = 120


def candidate_name(tool: str, model: str) -> str:
    """The candidate a (tool, model) pair is in the records and the report."""
    return f"{tool}/{model}"


# What stands for the gateway's URL and a run's key in the recorded configuration.
_URL_SHOWN, _KEY_SHOWN = f"http://{INSIDE_HOST}", "<the run's key>"
# As much of a key as marks it ("sk-" and 9 random characters) when a tool prints it.
_KEY_PREFIX = 12


def tool_config_record(tool: str, model: str) -> dict[str, Any]:
    """The tool's configuration as every run of it gets it (the manifest's record): its
    files, environment and command, with the run's key shown as a placeholder."""
    config = config_for(tool, _URL_SHOWN, _KEY_SHOWN, model)
    return {
        "files": dict(config.files),
        "env": dict(config.env),
        "command": batch_command(tool, "<the task's instruction>", model, ["<the task's files>"]),
    }


def tool_versions(settings: ToolSettings) -> dict[str, str | None]:
    """Each tool's `--version`, run in the sandbox; None for a tool that is not there or
    does not answer. Blocking."""
    versions: dict[str, str | None] = {}
    for tool in settings.tools:
        command = settings.tools_bin / tool
        if not command.exists():
            versions[tool] = None
            continue
        with tempfile.TemporaryDirectory(prefix="eval-tool-version-") as empty:
            outcome = sandbox.run(
                [str(command), "--version"],
                Path(empty),
                dataclasses.replace(settings.limits, wall_s=60.0),
                _environment(settings),
                mounts={str(settings.tools_bin.parent): settings.tools_bin.parent},
            )
        line = (outcome.stdout.strip().splitlines() or [""])[0]
        versions[tool] = line if outcome.ok and line else None
    return versions


async def tool_attempt(
    admin: Admin,
    base_url: str,
    settings: ToolSettings,
    prices: Prices,
    test_limits: sandbox.Limits,
    version: str | None,
    tool: str,
    model: str,
    task: Task,
    index: int,
) -> Attempt:
    """One attempt of `tool` on `model` at `task`, judged and attributed."""
    attempt = Attempt(
        candidate=candidate_name(tool, model), task=task.id, attempt=index,
        category=task.category, passed=False, tool=tool, model=model,
    )  # fmt: skip
    if version is None:
        attempt.reason = (
            f"tool: {tool} is not installed in {settings.tools_bin} "
            "(scripts/coding-tools.sh installs the pinned tools)"
        )
        return attempt
    name = f"gateway eval: {attempt.candidate} {task.id} #{index}"
    key = await admin.create_key(
        settings.tenant, name[:128], model, settings.limits.wall_s + KEY_GRACE_S,
        settings.requests_per_minute,
    )  # fmt: skip
    attempt.key_id = key.id
    started, clock = time.time(), time.monotonic()
    try:
        with judge.working_copy(task) as project:
            async with GatewayBridge(base_url) as bridge:
                config = config_for(tool, bridge.inside_url, key.secret, model)
                command = batch_command(
                    tool, task.instruction, model, [p for p, _ in task.snapshot]
                )
                command[0] = str(settings.tools_bin / command[0])
                stop = threading.Event()
                try:
                    outcome = await asyncio.to_thread(
                        run_tool, command, project, config.files,
                        {**_environment(settings), **config.env}, bridge,
                        settings.tools_bin.parent, project.parent / "result", settings.limits,
                        stop,
                    )  # fmt: skip
                except asyncio.CancelledError:
                    stop.set()  # the run is interrupted: the tool ends now, not at its limit
                    raise
            attempt.total_s = time.monotonic() - clock
            attempt.tool_exit = outcome.outcome.returncode
            if outcome.result is None:
                attempt.reason = f"tool: {_stopped(outcome.outcome, outcome.problem, settings)}"
            else:
                try:
                    await asyncio.to_thread(_judge, attempt, task, outcome.result, test_limits)
                except (OSError, shutil.Error, UnicodeError) as exc:
                    # What a hostile tool left (names, types) is its attempt's failure.
                    attempt.passed = False
                    attempt.reason = f"tool: what it left could not be judged ({exc})"
                if not attempt.passed and attempt.tool_exit != 0:
                    last = (outcome.outcome.stderr.strip().splitlines() or ["no output"])[-1]
                    attempt.reason = (
                        f"tool: exited with status {attempt.tool_exit} ({last[:200]}); "
                        f"{attempt.reason}"
                    )
    finally:
        await admin.revoke(key.id)
    _redact(attempt, key.secret)
    records = await admin.settled_requests(key.id, started - 1.0)
    take_calls(attempt, records, prices, model)
    return attempt


def _redact(attempt: Attempt, secret: str) -> None:
    """The run's key out of what the tool can put in the record (its last line, its
    files' and tests' names), whole or cut short: the record never holds it."""
    pattern = re.compile(re.escape(secret[:_KEY_PREFIX]) + r"[\w-]*")
    if attempt.reason is not None:
        attempt.reason = pattern.sub(_KEY_SHOWN, attempt.reason)
    for names in (attempt.files_touched, attempt.tests_passed, attempt.tests_failed):
        names[:] = [pattern.sub(_KEY_SHOWN, name) for name in names]


def _judge(attempt: Attempt, task: Task, result: Path, limits: sandbox.Limits) -> None:
    """The hidden tests on what the tool left (in a thread)."""
    attempt.files_touched = touched(dict(task.snapshot), result)
    attempt.expected_files_touched = sorted(attempt.files_touched) == sorted(task.expected_files)
    verdict = judge.judge_project(task, result, limits)
    attempt.passed, attempt.reason = verdict.passed, verdict.reason
    attempt.tests_passed, attempt.tests_failed = verdict.tests_passed, verdict.tests_failed
    attempt.tests_s = verdict.duration_s


def touched(snapshot: Mapping[str, str], result: Path) -> list[str]:
    """The project's files the tool added, changed or removed. A tool's own state (a
    top-level name starting with a dot: `.aider.chat.history.md`, `.codex/`) is not the
    project's."""
    found = {
        str(path.relative_to(result))
        for path in result.rglob("*")
        if path.is_file() and not path.relative_to(result).parts[0].startswith(".")
    }
    changed = {
        name for name in found if snapshot.get(name) != (result / name).read_text(errors="replace")
    }
    return sorted(changed | (snapshot.keys() - found))


def take_calls(
    attempt: Attempt, records: Iterable[dict[str, Any]], prices: Prices, model: str
) -> None:
    """The attempt's calls, tokens, cost and stability, from the ledger's records of its
    key, oldest first."""
    calls = [
        Call(
            endpoint=str(r["endpoint"]), model_served=str(r["model_served"]),
            status=int(r["status"]), prompt_tokens=int(r["prompt_tokens"]),
            cached_tokens=int(r["cached_tokens"]), completion_tokens=int(r["completion_tokens"]),
            latency_ms=float(r["latency_ms"]),
            ttft_ms=None if r.get("ttft_ms") is None else float(r["ttft_ms"]),
            fallback=str(r.get("fallback") or ""),
        )
        for r in records
    ]  # fmt: skip
    attempt.calls = calls
    attempt.tokens_in = sum(call.prompt_tokens for call in calls)
    attempt.tokens_out = sum(call.completion_tokens for call in calls)
    attempt.cached_tokens = sum(call.cached_tokens for call in calls)
    costs = [
        prices.cost(
            call.model_served or model,
            call.prompt_tokens,
            call.completion_tokens,
            call.cached_tokens,
        )
        for call in calls
    ]
    priced = [cost for cost in costs if cost is not None]
    attempt.cost = sum(priced) if priced or model in prices.models else None
    first = next((call.ttft_ms for call in calls if call.ttft_ms is not None), None)
    attempt.ttft_s = None if first is None else first / 1000
    requests = attempt.requests
    requests.sent = len(calls)
    requests.status_429 = sum(call.status == 429 for call in calls)
    requests.status_503 = sum(call.status == 503 for call in calls)
    requests.status_5xx = sum(call.status >= 500 for call in calls)
    # A call the gateway refused or failed, and the tool asked again after it.
    requests.retries = sum(call.status >= 400 for call in calls[:-1])
    failed = [call for call in calls if call.status >= 400]
    attempt.error = f"{failed[-1].endpoint}: status {failed[-1].status}" if failed else None
    attempt.fallback = next((call.fallback for call in calls if call.fallback), None)


def _stopped(outcome: sandbox.Outcome, problem: str | None, settings: ToolSettings) -> str:
    if problem is not None:
        return problem
    if outcome.stopped == "timeout":
        return f"stopped at the time limit ({settings.limits.wall_s:g} s)"
    if outcome.stopped == "memory":
        return f"stopped at the memory limit ({settings.limits.memory_bytes >> 20} MiB)"
    return f"stopped ({outcome.stopped})"


def _environment(settings: ToolSettings) -> dict[str, str]:
    return {
        "PATH": f"{settings.tools_bin}:/usr/local/bin:/usr/bin:/bin",
        "HOME": HOME,
        "CODEX_HOME": f"{HOME}/.codex",
        "TERM": "dumb",
        "NO_COLOR": "1",
    }
