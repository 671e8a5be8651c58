"""A coding tool's run in the sandbox: the gateway is its one way out, its home is its
own, and what it leaves in the task directory comes back to be judged. The "tool"
here is a Python script standing in for the real ones (tests/e2e runs those), in the
real bwrap sandbox, against a real HTTP server standing in for the gateway."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from gateway.eval.tool_sandbox import TOOL_LIMITS, GatewayBridge, ToolOutcome, run_tool


@pytest.fixture
async def gateway_url() -> AsyncIterator[str]:
    """A server standing in for the gateway: it echoes the request's path and key."""

    async def answer(request: web.Request) -> web.Response:
        key = request.headers.get("Authorization", "")
        return web.json_response({"path": request.path, "key": key})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()


async def run_script(
    script: str, project: Path, gateway_url: str, tmp_path: Path, **limits: float
) -> ToolOutcome:
    """The script run as the tool, on `project`, with the bridge to `gateway_url`."""
    tool_dir = tmp_path / "tool"
    tool_dir.mkdir(exist_ok=True)
    (tool_dir / "tool.py").write_text(textwrap.dedent(script))
    chosen = dataclasses.replace(TOOL_LIMITS, **limits)
    async with GatewayBridge(gateway_url) as bridge:
        return await asyncio.to_thread(
            run_tool,
            [sys.executable, str(tool_dir / "tool.py")],
            project,
            {".tool/config.json": '{"base_url": "' + bridge.inside_url + '"}'},
            {"GATEWAY_API_KEY": "sk-run-key"},
            bridge,
            tool_dir,
            tmp_path / "result",
            chosen,
        )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    directory = tmp_path / "project"
    (directory / "pkg").mkdir(parents=True)
    (directory / "pkg" / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    return directory


async def test_the_tool_reaches_the_gateway_and_its_changes_come_back(
    project: Path, gateway_url: str, tmp_path: Path
) -> None:
    outcome = await run_script(
        """
        import json, os, urllib.request
        home = os.environ["HOME"]
        config = json.load(open(os.path.join(home, ".tool", "config.json")))
        request = urllib.request.Request(
            config["base_url"] + "/models",
            headers={"Authorization": "Bearer " + os.environ["GATEWAY_API_KEY"]},
        )
        answer = json.load(urllib.request.urlopen(request, timeout=10))
        # The tool writes in its home (kept in the sandbox) and in the task directory.
        open(os.path.join(home, "session.log"), "w").write("a session")
        open("pkg/calc.py", "w").write("def add(a, b):\\n    return a + b\\n")
        open("answer.json", "w").write(json.dumps(answer))
        """,
        project,
        gateway_url,
        tmp_path,
    )
    assert outcome.outcome.ok, outcome.outcome.stderr
    assert outcome.result is not None
    assert (outcome.result / "pkg" / "calc.py").read_text().endswith("return a + b\n")
    assert '"path": "/v1/models"' in (outcome.result / "answer.json").read_text()
    assert "sk-run-key" in (outcome.result / "answer.json").read_text()
    assert not (outcome.result / "session.log").exists()
    assert outcome.connections == 1
    # The project itself is as it was: the tool worked on a copy.
    assert (project / "pkg" / "calc.py").read_text().endswith("return a - b\n")


async def test_nothing_but_the_gateway_is_reachable(
    project: Path, gateway_url: str, tmp_path: Path
) -> None:
    port = gateway_url.split(":")[2].split("/")[0]
    outcome = await run_script(
        f"""
        import socket
        reached = []
        # The gateway's own port, the host's Redis, a public address: none from here.
        for address in [("127.0.0.1", {port}), ("127.0.0.1", 6379), ("1.1.1.1", 80)]:
            try:
                socket.create_connection(address, timeout=2).close()
                reached.append(address)
            except OSError:
                pass
        open("reached.txt", "w").write(repr(reached))
        """,
        project,
        gateway_url,
        tmp_path,
    )
    assert outcome.outcome.ok, outcome.outcome.stderr
    assert outcome.result is not None
    assert (outcome.result / "reached.txt").read_text() == "[]"


async def test_a_tool_that_never_exits_is_stopped_and_leaves_nothing_to_judge(
    project: Path, gateway_url: str, tmp_path: Path
) -> None:
    outcome = await run_script(
        """
        import time
        open("half.txt", "w").write("started")
        while True:
            time.sleep(1)
        """,
        project,
        gateway_url,
        tmp_path,
        wall_s=2.0,
    )
    assert outcome.outcome.stopped == "timeout"
    assert outcome.result is None


async def test_a_tool_that_leaves_too_much_is_told_and_nothing_is_judged(
    project: Path, gateway_url: str, tmp_path: Path
) -> None:
    outcome = await run_script(
        """
        for name in ("a", "b", "c"):
            open(name + ".bin", "wb").write(b"x" * (700 << 10))
        """,
        project,
        gateway_url,
        tmp_path,
        file_bytes=1 << 20,
    )
    # Each file fits; the three together do not fit in what the sandbox may hand back.
    assert outcome.result is None
    assert outcome.problem == "it left more than 1 MiB in the task directory (File too large)"


async def test_a_link_out_of_the_task_directory_does_not_come_back_as_a_host_path(
    project: Path, gateway_url: str, tmp_path: Path
) -> None:
    outcome = await run_script(
        """
        import os
        os.symlink("/etc/passwd", "passwd")
        os.symlink("../../outside", "pkg/out")
        os.symlink("calc.py", "pkg/same.py")
        """,
        project,
        gateway_url,
        tmp_path,
    )
    assert outcome.outcome.ok, outcome.outcome.stderr
    assert outcome.result is not None
    # The links out are left out; the rest, a link inside included, is judged.
    assert not (outcome.result / "passwd").is_symlink()
    assert not (outcome.result / "pkg" / "out").is_symlink()
    assert (outcome.result / "pkg" / "same.py").read_text() == (
        outcome.result / "pkg" / "calc.py"
    ).read_text()
