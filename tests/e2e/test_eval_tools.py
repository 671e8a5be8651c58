"""`gateway eval run --tool`: the real Codex CLI and Claude Code at three tasks of the
shipped suite, each run in the sandbox with a key of its own, through a real gateway to
the scripted coder model (a real Triton server replaying each tool's recorded calls).

The recordings say what each (tool, task) must come to (`expect`), so verdicts are
checked exactly; each attempt's calls and tokens, which the run takes from the gateway's
ledger, are checked against the gateway's other record of them, its access log; and
Codex's looping run on one task is stopped at the time limit and failed.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway_tools.dev.processes import stop
from gateway_tools.dev.replay import REPLAY_DIR
from gateway_tools.eval.records import Attempt, read_attempts, read_manifest
from tests.e2e.conftest import start_sim
from tests.e2e.stack import Gateway, model, start_gateway, tenant
from tests.polling import wait_for

ROOT = Path(__file__).resolve().parents[2]
MODEL = "coder-small"
TOOLS = ("codex", "claude")
# Right for both; wrong for Codex; Codex loops (`ls` each turn), Claude Code right.
TASKS = ("01-token-bucket-refill", "03-lru-cache-recency", "15-injectable-cache-clock")
LOOPING = ("codex", "15-injectable-cache-clock")
TOOL_TIMEOUT_S = 40
ADMIN_KEY = "sk-test-ops"


def expected() -> dict[tuple[str, str], bool]:
    """(tool, task) to whether the recorded calls must pass."""
    recorded = json.loads((REPLAY_DIR / f"{MODEL}.json").read_text())
    return {
        (r["tool"], r["task"]): r["expect"] == "pass"
        for r in recorded["recordings"]
        if r.get("tool") in TOOLS and r["task"] in TASKS
    }


@pytest.fixture(scope="module")
def eval_gateway(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    sim = start_sim(f"{MODEL}=@{REPLAY_DIR / MODEL}.json")
    tmp = tmp_path_factory.mktemp("eval-tools-gw")
    try:
        models = {
            MODEL: model(
                "triton_http", [sim.http_url], prompt_template="chatml",
                capabilities={"tools": True, "tool_parser": "hermes"},
                max_tokens_default=2048, max_tokens_limit=4096, context_length=32768,
                timeouts={"first_token_s": 15.0, "total_s": 120.0},
            )
        }  # fmt: skip
        tenants = {
            "evaluator": tenant("evaluator", [MODEL], priority="online"),
            "ops": tenant("ops", [], admin=True),
        }
        ledger = {"url": f"sqlite:///{tmp}/usage.db", "spool_dir": str(tmp / "spool"),
                  "flush_interval_ms": 200}  # fmt: skip
        gateway = start_gateway(tmp, models, redis_url, tenants=tenants, gateway={"ledger": ledger})
        try:
            yield gateway
        finally:
            stop(gateway.process)
    finally:
        sim.stop()


def tools_command(
    gateway: Gateway,
    out: Path,
    tasks: tuple[str, ...] = TASKS,
    tenant: str = "evaluator",
    timeout_s: float = TOOL_TIMEOUT_S,
) -> list[str]:
    return [
        sys.executable, "-m", "gateway.cli", "eval", "run", "--endpoint", gateway.base_url,
        "--model", MODEL, *(arg for tool in TOOLS for arg in ("--tool", tool)),
        *(arg for task in tasks for arg in ("--task", task)),
        "--tenant", tenant, "--admin-url", gateway.ops_url,
        "--tool-timeout", str(timeout_s), "--prices", str(ROOT / "evals" / "prices.yaml"),
        "--out", str(out),
    ]  # fmt: skip


def tools_env(tools_bin: Path) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "GATEWAY_TOOLS_BIN": str(tools_bin),
            "GATEWAY_EVAL_ADMIN_KEY": ADMIN_KEY}  # fmt: skip


def run_tools(
    gateway: Gateway, tools_bin: Path, out: Path, tasks: tuple[str, ...] = TASKS,
    tenant: str = "evaluator",
) -> subprocess.CompletedProcess[str]:  # fmt: skip
    return subprocess.run(
        tools_command(gateway, out, tasks, tenant), capture_output=True, text=True,
        env=tools_env(tools_bin), cwd=ROOT, timeout=900,
    )  # fmt: skip


@pytest.fixture(scope="module")
def finished_run(
    eval_gateway: Gateway, tools_bin: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    out = tmp_path_factory.mktemp("eval-tools") / "run"
    result = run_tools(eval_gateway, tools_bin, out)
    assert result.returncode == 0, result.stderr
    return out


def attempts_by_pair(out: Path) -> dict[tuple[str, str], Attempt]:
    return {(a.tool or "", a.task): a for a in read_attempts(out)}


def test_each_tool_is_judged_on_what_it_left_as_its_recordings_say(finished_run: Path) -> None:
    got = {pair: attempt.passed for pair, attempt in attempts_by_pair(finished_run).items()}
    assert got == expected()
    assert got[("codex", "03-lru-cache-recency")] is False  # the tools differ
    assert got[("claude", "03-lru-cache-recency")] is True
    wrong = attempts_by_pair(finished_run)[("codex", "03-lru-cache-recency")]
    assert wrong.reason is not None and wrong.reason.startswith("tests failed")
    assert wrong.tool_exit == 0


def test_a_looping_tool_is_stopped_at_the_time_limit_and_failed(finished_run: Path) -> None:
    looped = attempts_by_pair(finished_run)[LOOPING]
    assert not looped.passed
    assert looped.reason == f"tool: stopped at the time limit ({TOOL_TIMEOUT_S} s)"
    # It kept calling the model: far more calls than a run that finishes (two).
    assert looped.requests.sent > 5


def test_each_attempts_calls_and_tokens_are_the_gateways_own_records(
    finished_run: Path, eval_gateway: Gateway
) -> None:
    by_key: dict[str, list[dict[str, Any]]] = {}
    for line in eval_gateway.access_lines():
        if line.get("key_id"):
            by_key.setdefault(line["key_id"], []).append(line)
    for attempt in read_attempts(finished_run):
        assert attempt.key_id is not None
        logged = by_key.get(attempt.key_id, [])
        assert attempt.requests.sent == len(attempt.calls) == len(logged) > 0, attempt.key
        assert attempt.tokens_in == sum(line["prompt_tokens"] for line in logged)
        assert attempt.tokens_out == sum(line["completion_tokens"] for line in logged)
        assert [call.status for call in attempt.calls] == [line["status"] for line in logged]
        if attempt.passed:
            assert attempt.ttft_s is not None and attempt.cost is not None and attempt.cost > 0


def test_the_manifest_records_each_tools_version_and_configuration(finished_run: Path) -> None:
    candidates = read_manifest(finished_run)["candidates"]
    assert set(candidates) == {f"{tool}/{MODEL}" for tool in TOOLS}
    codex, claude = candidates[f"codex/{MODEL}"], candidates[f"claude/{MODEL}"]
    assert codex["tool_version"].startswith("codex-cli ")
    assert "Claude Code" in claude["tool_version"]
    assert codex["listed"] is True and claude["model"] == MODEL
    assert claude["tool_config"]["env"]["ANTHROPIC_MODEL"] == MODEL
    # The runs' keys are never recorded, only a placeholder.
    assert "sk-" not in json.dumps(candidates)


def test_a_tool_that_is_not_installed_is_a_clear_failure_and_the_run_ends(
    eval_gateway: Gateway, tmp_path: Path
) -> None:
    empty = tmp_path / "tools" / "bin"
    empty.mkdir(parents=True)
    out = tmp_path / "run"
    result = run_tools(eval_gateway, empty, out, tasks=TASKS[:1])
    assert result.returncode == 0, result.stderr
    for attempt in read_attempts(out):
        assert not attempt.passed
        assert attempt.reason is not None
        assert attempt.reason.startswith(f"tool: {attempt.tool} is not installed in {empty}")


# Exits at once, printing its key cut short (as a tool's error may) and naming a file
# after it, and leaves a file where the judge puts the hidden tests.
def fake_tools(directory: Path, scripts: dict[str, str]) -> Path:
    """A tools' bin directory of shell scripts standing in for the tools, by name."""
    bin_dir = directory / "fake-tools" / "bin"
    bin_dir.mkdir(parents=True)
    for name, script in scripts.items():
        (bin_dir / name).write_text(script)
        (bin_dir / name).chmod(0o755)
    return bin_dir


FAKE_CODEX = """#!/bin/sh
if [ "$1" = --version ]; then echo "codex-cli 0.0.0-exits-at-once"; exit 0; fi
echo planted > _hidden_tests
touch "leak-$GATEWAY_API_KEY"
key=$GATEWAY_API_KEY
echo "error: no model provider configured for key ${key%?}" >&2
exit 3
"""
# Writes outside the task directory (its home, /tmp, the root, the tools' own files),
# then the task file, and exits 0.
FAKE_CLAUDE = """#!/bin/sh
if [ "$1" = --version ]; then echo "2.0.0 (writes outside)"; exit 0; fi
echo escaped > "$HOME/escaped" ; echo escaped > /tmp/{marker}
echo escaped > /{marker} ; echo escaped > "$(dirname "$0")/{marker}"
echo escaped > ../{marker}
echo "# touched" >> ratelimit/bucket.py
exit 0
"""


def test_a_tool_that_exits_at_once_or_writes_outside_its_task_is_a_clear_bounded_failure(
    eval_gateway: Gateway, tmp_path: Path
) -> None:
    marker = f"gateway-eval-escape-{tmp_path.name}"
    fake = fake_tools(tmp_path, {"codex": FAKE_CODEX, "claude": FAKE_CLAUDE.format(marker=marker)})
    out = tmp_path / "run"
    result = run_tools(eval_gateway, fake, out, tasks=TASKS[:1])
    assert result.returncode == 0, result.stderr
    attempts = attempts_by_pair(out)
    exited = attempts[("codex", TASKS[0])]
    assert exited.tool_exit == 3 and not exited.passed
    assert exited.reason is not None
    # Judged all the same (the planted file made way for the tests); the key is not in
    # the record.
    assert exited.reason.startswith(
        "tool: exited with status 3 (error: no model provider configured for key "
        "<the run's key>); tests failed"
    )
    assert "leak-<the run's key>" in exited.files_touched
    assert "sk-" not in (out / "attempts.jsonl").read_text()
    outside = attempts[("claude", TASKS[0])]
    # Only the task directory comes back: what it wrote anywhere else stayed in the
    # sandbox, which is gone.
    assert outside.files_touched == ["ratelimit/bucket.py"] and not outside.passed
    for place in (Path("/tmp") / marker, Path("/") / marker, fake / marker):
        assert not place.exists(), place


def test_a_tenant_that_cannot_have_the_keys_is_refused_before_anything_is_written(
    eval_gateway: Gateway, tools_bin: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    result = run_tools(eval_gateway, tools_bin, out, tasks=TASKS[:1], tenant="nosuch")
    assert result.returncode == 2
    assert result.stderr.startswith(
        f"eval run: the tools' tenant 'nosuch' cannot have a key for {MODEL}: "
        "POST /admin/keys: 400: "
    ), result.stderr
    assert "Traceback" not in result.stderr
    # Nothing holds the directory: the same command with the right tenant may use it.
    assert not (out / "manifest.json").exists()


SLEEPING_TOOL = """#!/bin/sh
if [ "$1" = --version ]; then echo "0.0.0-sleeps"; exit 0; fi
exec sleep 3600
"""


def test_an_interrupted_run_ends_its_tools_at_once_and_can_be_resumed(
    eval_gateway: Gateway, tmp_path: Path
) -> None:
    fake = fake_tools(tmp_path, dict.fromkeys(TOOLS, SLEEPING_TOOL))
    out = tmp_path / "run"
    # A time limit far past the test's: only the interrupt can end these tools in time.
    command = tools_command(eval_gateway, out, TASKS[:1], timeout_s=3000)
    run = subprocess.Popen(
        command, env=tools_env(fake), cwd=ROOT, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for(lambda: sleeping_tools() != [], "a tool running", timeout_s=120)
        run.send_signal(signal.SIGINT)
        _, stderr = run.communicate(timeout=120)
    finally:
        run.kill()
    assert run.returncode == 130, stderr
    assert "interrupted: finished attempts are kept" in stderr
    assert "Traceback" not in stderr, stderr
    assert sleeping_tools() == []
    # Resumable: the manifest is whole, and no attempt was recorded half-way.
    assert read_manifest(out)["candidates"].keys() == {f"{tool}/{MODEL}" for tool in TOOLS}
    assert read_attempts(out) == []


def sleeping_tools() -> list[int]:
    """The pids of the sleeping fake tools still running (their `sleep 3600`)."""
    found = subprocess.run(["pgrep", "-f", "^sleep 3600$"], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split()]
