"""A coding tool's run in the sandbox: the gateway is its one way out, its home is its
own, and what it leaves in the task directory comes back to be judged. The "tool"
here is a Python script standing in for the real ones (tests/e2e runs those), in the
real bwrap sandbox, against a real HTTP server standing in for the gateway."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import subprocess
import sys
import tarfile
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from gateway_tools.eval.tool_sandbox import (
    TOOL_LIMITS,
    GatewayBridge,
    ToolOutcome,
    run_tool,
    unpack_task,
)


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
        os.link("pkg/calc.py", "pkg/hard.py")
        """,
        project,
        gateway_url,
        tmp_path,
    )
    assert outcome.outcome.ok, outcome.outcome.stderr
    assert outcome.result is not None
    # The links out are left out; a link to a file inside comes back as that file, and
    # so does each name of a hard-linked one.
    assert not (outcome.result / "passwd").exists()
    assert not (outcome.result / "pkg" / "out").exists()
    calc = (outcome.result / "pkg" / "calc.py").read_text()
    assert calc == "def add(a, b):\n    return a - b\n"
    for name in ("same.py", "hard.py"):
        assert not (outcome.result / "pkg" / name).is_symlink()
        assert (outcome.result / "pkg" / name).read_text() == calc


async def test_the_tool_cannot_trace_the_process_that_hands_its_work_back(
    project: Path, gateway_url: str, tmp_path: Path
) -> None:
    # Its parent holds the descriptor the task directory goes out through: a tool that
    # could attach to it (same user) could hand back a stream of its own making.
    outcome = await run_script(
        """
        import ctypes, os
        parent = os.getppid()
        libc = ctypes.CDLL(None, use_errno=True)
        attached = libc.ptrace(16, parent, 0, 0) == 0  # PTRACE_ATTACH
        if attached:
            libc.ptrace(17, parent, 0, 0)  # PTRACE_DETACH: the parent goes on
        try:
            descriptors = os.listdir(f"/proc/{parent}/fd")
        except OSError:
            descriptors = None
        open("probe.txt", "w").write(repr((attached, descriptors)))
        """,
        project,
        gateway_url,
        tmp_path,
    )
    assert outcome.result is not None, outcome.problem
    assert (outcome.result / "probe.txt").read_text() == "(False, None)"


async def test_the_tools_key_is_in_no_command_line_on_the_host(
    project: Path, gateway_url: str, tmp_path: Path
) -> None:
    # Any user of the host reads every process's command line (ps).
    seen: list[str] = []

    def command_lines() -> list[str]:
        lines = []
        for entry in Path("/proc").iterdir():
            with contextlib.suppress(OSError):
                lines.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        return lines

    async def watch() -> None:
        # Once the tool itself runs, every process of the sandbox's chain is up.
        for _ in range(600):
            if any("tool.py" in line and "bwrap" not in line for line in command_lines()):
                break
            await asyncio.sleep(0.05)
        seen.extend(line for line in command_lines() if "sk-run-key" in line)

    watching = asyncio.create_task(watch())
    outcome = await run_script(
        """
        import os, time
        open("key.txt", "w").write(os.environ["GATEWAY_API_KEY"])
        time.sleep(3)
        """,
        project,
        gateway_url,
        tmp_path,
    )
    await asyncio.wait_for(watching, timeout=1)
    assert seen == []
    assert outcome.result is not None, outcome.problem
    assert (outcome.result / "key.txt").read_text() == "sk-run-key"


def add_member(
    tar: tarfile.TarFile, name: str, kind: bytes, link: str = "", data: bytes = b""
) -> None:
    member = tarfile.TarInfo(name)
    member.type, member.linkname, member.size, member.mode = kind, link, len(data), 0o755
    tar.addfile(member, io.BytesIO(data) if data else None)


def test_a_hostile_stream_unpacks_nothing_outside_the_result(tmp_path: Path) -> None:
    # A tool cannot write the stream (above); were it to, this is what it would try.
    outside, into = tmp_path / "outside", tmp_path / "work" / "result"
    outside.mkdir()
    stream = tmp_path / "task.tar"
    with tarfile.open(stream, "w", format=tarfile.PAX_FORMAT) as tar:
        # The chain of links that passes tarfile's data filter before 3.11.13
        # (CVE-2025-4517): long directories, a link to each, a link up through them all.
        steps, path = "abcdefghijklmnop", ""
        long = "d" * ((4096 - len(str(into)) - 1) // (len(steps) + 1))
        for step in steps:
            add_member(tar, f"{path}{long}", tarfile.DIRTYPE)
            add_member(tar, f"{path}{step}", tarfile.SYMTYPE, long)
            path += f"{long}/"
        up = "/".join([*steps, "l" * 254])
        add_member(tar, up, tarfile.SYMTYPE, "/".join([".."] * len(steps)))
        add_member(tar, "escape", tarfile.SYMTYPE, f"{up}/{'../' * 12}{outside}")
        add_member(tar, "escape/PWNED", tarfile.REGTYPE, data=b"pwned")
        # Plainer ways out, and names no project has.
        add_member(tar, f"../{outside.name}/up", tarfile.REGTYPE, data=b"pwned")
        add_member(tar, f"{outside}/absolute", tarfile.REGTYPE, data=b"pwned")
        add_member(tar, "hard", tarfile.LNKTYPE, f"{outside}/target")
        add_member(tar, "null", tarfile.CHRTYPE)
        add_member(tar, "/".join(["deep"] * 40), tarfile.REGTYPE, data=b"deep")
        add_member(tar, "n" * 300, tarfile.REGTYPE, data=b"long")
        add_member(tar, "pkg/calc.py", tarfile.REGTYPE, data=b"def add(a, b): ...\n")
    assert unpack_task(stream, into) is None
    assert list(outside.iterdir()) == []
    # No link is made, so "escape/" is a plain directory of the result.
    files = sorted(str(p.relative_to(into)) for p in into.rglob("*") if not p.is_dir())
    assert files == ["escape/PWNED", "pkg/calc.py"]
    assert not any(p.is_symlink() for p in into.rglob("*"))


def test_a_sparse_member_is_not_unpacked_to_its_full_size(tmp_path: Path) -> None:
    # A few bytes of stream standing for 300 MiB on the host's disk.
    (tmp_path / "source").mkdir()
    big = tmp_path / "source" / "big"
    with open(big, "wb") as file:
        file.truncate(300 << 20)
        file.seek(0, 2)
        file.write(b"x")
    (tmp_path / "source" / "small.py").write_text("x = 1\n")
    stream = tmp_path / "task.tar"
    subprocess.run(["tar", "--sparse", "-C", str(tmp_path / "source"), "-cf", str(stream), "."],
                   check=True)  # fmt: skip
    assert stream.stat().st_size < 1 << 20
    into = tmp_path / "result"
    assert unpack_task(stream, into) is None
    assert not (into / "big").exists()
    assert (into / "small.py").read_text() == "x = 1\n"
