"""`gateway demo` as a user runs it: Claude Code's and Codex CLI's default model names are
served, a node killed with SIGKILL is reported, its replicas are placed on the other node,
the demo keeps serving, and the node comes back; its usage ledger is the run's own; its
MCP server (the project's docs) answers through `/mcp`."""

from __future__ import annotations

import os
import re
import signal
import time
import urllib.request
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import anthropic
from openai import OpenAI, OpenAIError

from gateway_tools.dev.demo import NODE_RESTART_ENV
from gateway_tools.dev.processes import free_port, gateway_command, spawn, stop, wait_gateway_ready
from tests import ports
from tests.e2e.mcp.test_mcp_gateway import new_session, post_raw

# A hang guard for each wait, far above what the demo needs.
GUARD_S = 120.0


def tritonserver_pid(http_port: int) -> int:
    """The tritonserver serving HTTP on `http_port` (a node of the demo)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"tritonserver") and f"--http-port={http_port}".encode() in argv:
            return int(entry.name)
    raise AssertionError(f"no tritonserver on port {http_port}")


def answers(client: OpenAI, model: str) -> bool:
    try:
        reply = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    except OpenAIError:
        return False
    return reply.model == model


def the_tools_default_names_are_served(port: int) -> None:
    """What `claude -p` and `codex exec` send with no model named reaches the demo's
    coding model (config/gateway.yaml's alias patterns), and globex's own map."""
    hi: Any = [{"role": "user", "content": "hi"}]
    for key, name, serving in [
        ("sk-acme-demo", "claude-opus-4-8[1m]", "llm-large"),
        ("sk-acme-demo", "claude-haiku-4-5-20251001", "llm-small"),  # its side calls
        ("sk-globex-demo", "claude-opus-4-8[1m]", "llm-small"),
    ]:
        claude = anthropic.Anthropic(
            base_url=f"http://127.0.0.1:{port}", api_key=key, max_retries=0
        )
        assert claude.messages.create(model=name, max_tokens=2, messages=hi).model == serving
    codex = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-acme-demo", max_retries=0)
    reply = codex.responses.create(model="gpt-5.6-codex", input="hi", max_output_tokens=2)
    assert reply.model == "llm-large"


def the_docs_are_an_mcp_server(port: int) -> None:
    """The demo's own MCP server (nothing installed beyond the project) answers through
    `/mcp` under a demo key: a search of the project's docs."""
    url = f"http://127.0.0.1:{port}"
    session = new_session(url, "sk-acme-demo")
    call = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "docs__search_docs", "arguments": {"query": "bubblewrap sandbox"}},
    }
    status, _, body = post_raw(url, "sk-acme-demo", call, session=session)
    assert status == 200, body
    assert "mcp.md:" in body["result"]["content"][0]["text"], body


def wait_for(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + GUARD_S
    while not check():
        assert time.monotonic() < deadline, f"still not so after {GUARD_S} s: {what}"
        time.sleep(0.5)


def test_the_demo_keeps_serving_when_a_node_dies_and_takes_it_back(tmp_path: Path) -> None:
    port = free_port(span=2, start=ports.GATEWAYS, end=ports.CLUSTER_NODES)
    ops_port = port + 1
    log = tmp_path / "demo.log"
    # Longer than the gateway takes to call a node down (3 probes, 2 s apart).
    env = {**os.environ, NODE_RESTART_ENV: "15"}
    demo = spawn(
        gateway_command("demo", "--port", str(port), "--ops-port", str(ops_port)), env=env, log=log
    )
    try:
        wait_gateway_ready(f"http://127.0.0.1:{port}", GUARD_S, demo)
        # The ledger is this run's (not a file every demo and test shares in /tmp).
        wait_for(lambda: "Ledger:" in log.read_text(), "the ledger's line")
        ledger = re.search(r"Ledger: +GATEWAY_STATE_DIR=(\S+) ", log.read_text())
        assert ledger is not None, log.read_text()
        state_dir = Path(ledger.group(1))
        assert state_dir.name.startswith("gateway-demo-") and state_dir.is_dir()
        the_tools_default_names_are_served(port)
        the_docs_are_an_mcp_server(port)
        found = re.search(r"node-a: triton-sim \S+ on 127\.0\.0\.1:(\d+)", log.read_text())
        assert found is not None, log.read_text()
        os.kill(tritonserver_pid(int(found.group(1))), signal.SIGKILL)

        wait_for(lambda: "node-a (triton-sim on" in log.read_text(), "the death reported")
        wait_for(lambda: "node node-a is down" in log.read_text(), "node-a called down")
        client = OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-acme-demo", max_retries=0
        )
        # Every model gets a replica on node-b (availability before redundancy) and
        # answers again while node-a is dead.
        for model in ("llm-large", "llm-small"):
            wait_for(partial(answers, client, model), f"{model} answers")
        assert demo.poll() is None, log.read_text()
        assert "node-a: starting triton-sim again" not in log.read_text()
        # llm-large's second replica waits for the node, and an alert can say so.
        with urllib.request.urlopen(f"http://127.0.0.1:{ops_port}/metrics") as response:
            exposition = response.read().decode()
        assert 'gateway_replicas_unplaced{model="llm-large"} 1.0' in exposition
        assert 'gateway_replicas_unplaced{model="llm-small"} 0.0' in exposition

        wait_for(lambda: "node-a: starting triton-sim again" in log.read_text(), "a restart")
        wait_for(lambda: "node node-a is back" in log.read_text(), "node-a back")
        for model in ("llm-large", "llm-small"):
            assert answers(client, model)
        assert demo.poll() is None
        assert (state_dir / "gateway-demo-usage.db").is_file()
    finally:
        stop(demo)
    assert not state_dir.exists()  # removed with the run it belonged to
