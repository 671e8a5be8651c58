"""The real MCP clients through the gateway (issue 45): the MCP Inspector's CLI, Claude
Code and Codex CLI, each unchanged, configured as `gateway tools config` says; behind
the gateway the npm registry's own servers (`server-everything`, `server-filesystem`,
over stdio in the sandbox) beside the tests' notes server. The coding tools run a
scripted session against a real Triton serving the scripted agent
(`evals/replay/agent.json`): its first turn calls the gateway's `notes__echo`, its last
answers once the tool's result is in the prompt. Done means the tool exited 0, the call
went through the gateway (its record: tenant, tool, 200) and nothing was refused."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.config import hash_key
from gateway_tools.clients.tool_config import config_for
from gateway_tools.dev.processes import stop
from gateway_tools.dev.sim.server import TritonSim
from tests.e2e.conftest import AGENT, agent_model, installed
from tests.e2e.mcp.conftest import stdio_server
from tests.e2e.stack import Gateway, start_gateway, tenant

ROOT = Path(__file__).resolve().parents[3]
KEY = "sk-test-mcp-coders"
TASK = "call the gateway's notes echo tool with mcp-through-the-gateway"


@pytest.fixture(scope="module")
def npm_servers() -> Path:
    """The pinned npm packages: server-everything, server-filesystem, the Inspector."""
    return installed("mcp-tools.sh")


def package(npm_servers: Path, name: str) -> tuple[str, str]:
    """A package's npm prefix (resolved: the sandbox mounts it) and its entry point."""
    prefix = os.path.realpath(npm_servers / name)
    entry = Path(prefix) / "node_modules" / "@modelcontextprotocol" / name / "dist" / "index.js"
    assert entry.is_file(), entry
    return prefix, str(entry)


@pytest.fixture(scope="module")
def files_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The filesystem server's one directory, writable by the sandbox's user."""
    root = tmp_path_factory.mktemp("mcp-files")
    (root / "notes.txt").write_text("the gateway reads this\n")
    for path in (root, root.parent, root / "notes.txt"):
        path.chmod(0o777 if path.is_dir() else 0o666)
    return root


@pytest.fixture(scope="module")
def clients_gateway(
    agent_sim: TritonSim,
    npm_servers: Path,
    files_root: Path,
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Gateway]:
    everything_prefix, everything = package(npm_servers, "server-everything")
    files_prefix, filesystem = package(npm_servers, "server-filesystem")
    servers = {
        "notes": stdio_server("notes_server.py"),
        "everything": {
            "command": ["node", everything],
            "sandbox": {"read_only": [everything_prefix]},
        },
        "files": {
            "command": ["node", filesystem, str(files_root)],
            "sandbox": {"read_only": [files_prefix], "writable": [str(files_root)]},
        },
    }
    models = {AGENT: agent_model(agent_sim)}
    tenants = {"coders": {**tenant("coders", ["*"]), "api_keys": [hash_key(KEY)]}}
    tmp = tmp_path_factory.mktemp("mcp-clients")
    gw = start_gateway(
        tmp,
        models,
        redis_url,
        tenants=tenants,
        gateway={
            "redis": {"url": redis_url, "key_prefix": f"gw-{tmp.name}"},
            "mcp": {"servers": servers},
            "ledger": {"url": f"sqlite:///{tmp / 'usage.db'}", "flush_interval_ms": 50},
        },
    )
    try:
        yield gw
    finally:
        stop(gw.process)


def inspector(npm_servers: Path, gateway: Gateway, *args: str) -> Any:
    """The MCP Inspector's CLI on the gateway, with the key as a header; its JSON."""
    binary = npm_servers / "inspector" / "node_modules" / ".bin" / "mcp-inspector"
    run = subprocess.run(
        [
            str(binary),
            "--cli",
            f"{gateway.url}/mcp",
            "--transport",
            "http",
            "--header",
            f"Authorization: Bearer {KEY}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    return json.loads(run.stdout)


def test_the_inspector_lists_and_calls_the_npm_servers_through_the_gateway(
    npm_servers: Path, clients_gateway: Gateway, files_root: Path
) -> None:
    tools = {
        tool["name"]
        for tool in inspector(npm_servers, clients_gateway, "--method", "tools/list")["tools"]
    }
    assert {
        "everything__echo",
        "everything__get-sum",
        "files__read_text_file",
        "notes__echo",
    } <= tools
    summed = inspector(
        npm_servers, clients_gateway, "--method", "tools/call", "--tool-name",
        "everything__get-sum", "--tool-arg", "a=2", "--tool-arg", "b=40",
    )  # fmt: skip
    assert summed["content"][0]["text"] == "The sum of 2 and 40 is 42."
    read = inspector(
        npm_servers, clients_gateway, "--method", "tools/call", "--tool-name",
        "files__read_text_file", "--tool-arg", f"path={files_root / 'notes.txt'}",
    )  # fmt: skip
    assert read["content"][0]["text"] == "the gateway reads this\n"


def test_the_filesystem_server_sees_only_its_root_and_the_sandbox_holds_if_it_did_not(
    npm_servers: Path, clients_gateway: Gateway
) -> None:
    binary = npm_servers / "inspector" / "node_modules" / ".bin" / "mcp-inspector"
    outside = subprocess.run(
        [
            str(binary),
            "--cli",
            f"{clients_gateway.url}/mcp",
            "--transport",
            "http",
            "--header",
            f"Authorization: Bearer {KEY}",
            "--method",
            "tools/call",
            "--tool-name",
            "files__read_text_file",
            "--tool-arg",
            "path=/etc/passwd",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "Access denied" in outside.stdout
    # The server's environment is the sandbox's own: no key of the gateway's.
    env = inspector(
        npm_servers, clients_gateway, "--method", "tools/call", "--tool-name", "everything__get-env"
    )
    seen = json.loads(env["content"][0]["text"])
    assert set(seen) <= {"PATH", "HOME", "TMPDIR", "LANG", "PWD"}


def tool_calls(gateway: Gateway) -> list[dict[str, Any]]:
    """The access records of the gateway's MCP requests, oldest first."""
    return [line for line in gateway.access_lines() if line["endpoint"] == "mcp"]


def run_tool(
    tool: str, gateway: Gateway, tools_bin: Path, tmp_path: Path
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    """One scripted session of `tool`, configured as `gateway tools config` says (its
    setup commands run first); its run and the gateway's MCP records meanwhile."""
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    config = config_for(tool, gateway.url, KEY, AGENT)
    config.write(home)
    env = {
        "PATH": f"{tools_bin}{os.pathsep}{os.environ['PATH']}",
        "HOME": str(home),
        "CODEX_HOME": str(home / ".codex"),
        **config.env,
    }
    for setup in config.setup:
        subprocess.run(["bash", "-c", setup], env=env, cwd=work, check=True, timeout=120)
    if tool == "codex":
        command = [str(tools_bin / "codex"), "exec", "--skip-git-repo-check",
                   "--dangerously-bypass-approvals-and-sandbox", TASK]  # fmt: skip
    else:
        command = [str(tools_bin / "claude"), "-p", TASK,
                   "--allowedTools", "mcp__gateway__notes__echo"]  # fmt: skip
    seen = len(tool_calls(gateway))
    run = subprocess.run(
        command, cwd=work, env=env, capture_output=True, text=True, timeout=300, check=False,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    return run, tool_calls(gateway)[seen:]


@pytest.mark.parametrize("tool", ["claude", "codex"])
def test_the_coding_tool_calls_an_mcp_tool_through_the_gateway(
    tool: str, tools_bin: Path, clients_gateway: Gateway, tmp_path: Path
) -> None:
    run, records = run_tool(tool, clients_gateway, tools_bin, tmp_path)
    report = f"exit {run.returncode}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}\n{records}"
    assert run.returncode == 0, report
    assert "The notes tool answered through the gateway." in run.stdout, report
    calls = [r for r in records if r.get("requested_model") == "notes__echo"]
    assert calls and calls[-1]["status"] == 200 and calls[-1]["tenant"] == "coders", report
    assert all(r["status"] < 400 for r in records), report
