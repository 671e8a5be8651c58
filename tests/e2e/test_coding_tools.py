"""Codex CLI, Claude Code, opencode and aider, run unchanged against a real gateway
(issue 25).

The tools are installed at pinned versions by `scripts/coding-tools.sh` (from the npm
registry, aider from PyPI into a virtualenv of its own; cached between runs), configured
by `gateway tools config` (what docs/coding-tools.md shows), and run non-interactively
(`codex exec`, `claude -p`, `opencode run`, `aider --message`) on a task, against a real
Triton serving a scripted agent (`evals/replay/agent.json`): its first turn calls the
tool's own way of writing a file (Codex's `exec_command`, or with Codex's own default
model its custom `exec` tool; Claude Code's `Write`; opencode's `write`), its next one
ends the task; aider, which calls no tools, gets the whole file in its edit format. Done
means: the file the task asks for exists with the right content, the tool exited 0, and
the gateway answered none of the tool's requests with a 4xx or 5xx.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.config import hash_key
from gateway_tools.clients.tool_config import ToolConfig, config_for
from gateway_tools.dev.processes import stop
from gateway_tools.dev.sim.server import TritonSim
from tests.e2e.conftest import AGENT, agent_model
from tests.e2e.stack import Gateway, start_gateway, tenant

ROOT = Path(__file__).resolve().parents[2]
TASK = "write hello.py that prints hi"
KEY = "sk-test-coders"
# The runs: a tool with a model named, or with its own default model (None), which the
# gateway's aliases route (Codex CLI then sends its tools another way: a custom tool in
# an `additional_tools` item).
RUNS = {
    "codex": ("codex", AGENT),
    "codex-default-model": ("codex", None),
    "claude": ("claude", AGENT),
    "opencode": ("opencode", AGENT),
    "aider": ("aider", AGENT),
}
# What each run's file must hold: the scripted agent's command or content.
WRITTEN = {"codex": 'print("hi")\n', "codex-default-model": 'print("hi")\n',
           "claude": "print('hi')\n", "opencode": 'print("hi")\n',
           "aider": 'print("hi")\n'}  # fmt: skip
NAMES = {"codex": "Codex CLI", "codex-default-model": "Codex CLI, its default model",
         "claude": "Claude Code", "opencode": "opencode", "aider": "aider"}  # fmt: skip
# How each run's file got written: the tool it called, or (aider) its edit format.
CALLS = {"codex": "yes (`exec_command`)", "codex-default-model": "yes (custom `exec`)",
         "claude": "yes (`Write`)", "opencode": "yes (`write`)",
         "aider": "no (its whole-file edit format)"}  # fmt: skip
PATHS = {"chat": "chat/completions"}
DOC = ROOT / "docs" / "coding-tools.md"
TABLE = ("<!-- compatibility:start -->", "<!-- compatibility:end -->")
# What the gateway logs when it leaves something a tool sent out of the prompt.
LEFT_OUT = re.compile(r"(?:tools left out for model .*?|blocks dropped from the prompt): (.+)")


@pytest.fixture(scope="module")
def coders_gateway(
    agent_sim: TritonSim, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    # Codex CLI's default model names, routed to the agent.
    models = {AGENT: agent_model(agent_sim, aliases=["gpt-*"])}
    tenants = {"coders": {**tenant("coders", ["*"]), "api_keys": [hash_key(KEY)]}}
    gw = start_gateway(tmp_path_factory.mktemp("coders"), models, redis_url, tenants=tenants)
    try:
        yield gw
    finally:
        stop(gw.process)


def command(config: ToolConfig, bin_dir: Path) -> list[str]:
    tool = config.tool
    if tool == "codex":
        # The scripted agent's command is ours; Codex's own sandbox needs what a CI
        # container may not give (namespaces, Landlock), so it runs without it.
        return [str(bin_dir / "codex"), "exec", "--skip-git-repo-check",
                "--dangerously-bypass-approvals-and-sandbox", TASK]  # fmt: skip
    if tool == "claude":
        return [str(bin_dir / "claude"), "-p", TASK, "--allowedTools", "Write"]
    # aider and opencode: the command `gateway tools config` prints, as it prints it.
    name, *args = shlex.split(config.run)
    return [str(bin_dir / name), *args]


@pytest.mark.parametrize("run_name", list(RUNS))
def test_the_tool_does_the_task_through_the_gateway_with_no_refusal(
    run_name: str, tools_bin: Path, coders_gateway: Gateway, tmp_path: Path
) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    tool, model_name = RUNS[run_name]
    config = config_for(tool, coders_gateway.url, KEY, model_name)
    config.write(home)
    env = {
        "PATH": f"{tools_bin}{os.pathsep}{os.environ['PATH']}",
        "HOME": str(home),
        "CODEX_HOME": str(home / ".codex"),
        **config.env,
    }
    seen, logged = len(coders_gateway.access_lines()), len(coders_gateway.log)
    run = subprocess.run(
        command(config, tools_bin), cwd=work, env=env, capture_output=True, text=True,
        timeout=300, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    messages = [
        orjson.loads(line).get("message", "")
        for line in coders_gateway.log[logged:].splitlines()
        if line.startswith("{")
    ]
    lines = coders_gateway.access_lines()[seen:]
    report = f"exit {run.returncode}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}\n{lines}"
    assert run.returncode == 0, report
    assert (work / "hello.py").read_text() == WRITTEN[run_name], report
    assert lines, report  # it went through the gateway
    assert all(line["status"] < 400 for line in lines), report
    # The compatibility table in docs/coding-tools.md says what this run saw.
    version = subprocess.run(
        [str(tools_bin / tool), "--version"], capture_output=True, text=True, check=True
    ).stdout.strip()
    found = [names for message in messages for names in LEFT_OUT.findall(message)]
    left_out = sorted({name.strip() for names in found for name in names.split(",")})
    # The model APIs the tool used (Codex CLI also lists the gateway's MCP tools, `/mcp`:
    # its own test is tests/e2e/mcp/test_mcp_clients.py).
    model_lines = [line for line in lines if line["endpoint"] != "mcp"]
    row = compatibility_row(run_name, version, model_lines, left_out)
    assert row in documented_rows(), f"docs/coding-tools.md should have the row:\n{row}"


def compatibility_row(
    run_name: str, version: str, lines: list[dict[str, Any]], left_out: list[str]
) -> str:
    """One row of the compatibility table, from what a run did."""
    # The access log's endpoint is the path after /v1, but for chat completions.
    paths = {PATHS.get(line["endpoint"], line["endpoint"]) for line in lines}
    apis = ", ".join(sorted(f"`/v1/{path}`" for path in paths))
    streamed = "yes" if all(line["stream"] for line in lines) else "no"
    turns = "yes" if len(lines) > 1 else "no"
    omitted = ", ".join(f"`{name}`" for name in left_out) or "nothing"
    return (
        f"| {NAMES[run_name]} | {version} | {apis} | {streamed} | {CALLS[run_name]} "
        f"| {turns} | {omitted} |"
    )


def documented_rows() -> list[str]:
    text = DOC.read_text()
    table = text[text.index(TABLE[0]) : text.index(TABLE[1])]
    return [line for line in table.splitlines() if line.startswith("| ")]
