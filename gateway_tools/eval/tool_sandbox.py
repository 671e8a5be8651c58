"""A coding tool run on a task in the sandbox, with the gateway as its only way out.

`gateway eval run --tool` (docs/eval.md) runs the real tool (Codex CLI, Claude Code,
aider, opencode) non-interactively on a copy of a task's snapshot. It runs in the same
bubblewrap sandbox as the hidden tests (`sandbox.py`: nobody, namespaces of its own, no
host file but the system, Python and the tool's own install, read-only), with limits
of its own (a JavaScript runtime reserves far more address space than it uses, and an
agent runs for minutes, not seconds), and three additions:

- **The network is the gateway, and nothing else.** The sandbox has no network of its
  own. Its first process listens on `127.0.0.1:INSIDE_PORT` in the sandbox's loopback and
  forwards every connection to a Unix socket of the caller's, mounted in; the caller's
  side (`GatewayBridge`) connects each one to the gateway's address, the one address it
  was given. A tool that tries anything else (another port, a host name, the internet)
  finds nothing there.
- **A home of its own.** The tool's configuration (`gateway tools config`'s files) is
  copied into a private, writable home in the sandbox's `/tmp`, so what the tool writes
  there (sessions, caches) goes with the sandbox.
- **What it left comes back.** Once the tool exits, the first process (which the tool
  cannot trace) ends whatever the tool left running and writes the task directory as a
  tar stream to a file of the caller's, bounded by the file size limit; the caller
  unpacks it (regular files and directories at plain paths inside it only; a link to
  a file inside comes back as that file) and judges that. A tool stopped at the time
  limit leaves nothing to judge.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import tarfile
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from gateway_tools.eval import sandbox

# Where the tool finds the gateway, inside the sandbox's own loopback.
INSIDE_PORT = 4000
INSIDE_HOST = f"127.0.0.1:{INSIDE_PORT}"
# Inside the sandbox: the bridge's socket, the configuration to copy home, the home.
_BRIDGE_DIR = "/.gateway"
_HOME_SOURCE = "/.home-source"
HOME = "/tmp/home"
# A tool's run: minutes of an agent's loop, a JavaScript runtime's threads (counted as
# processes) and address space, the cgroup's memory bounding them all (as root).
TOOL_LIMITS = sandbox.Limits(
    wall_s=600.0,
    memory_bytes=4 << 30,
    address_space_bytes=1 << 40,
    processes=512,
    open_files=4096,
    file_bytes=128 << 20,
    disk_bytes=512 << 20,
)

# The sandbox's first process after the copy: the bridge to the caller's socket, the
# home, the tool, then the task directory out as a tar stream.
_INSIDE = r"""
import ctypes, os, shutil, signal, socket, subprocess, sys, tarfile, threading, time
bridge, port, home_source, out_fd, *command = sys.argv[1:]
# Not dumpable: the tool runs as the same user, and could otherwise ptrace this process
# or open its descriptors in /proc, and write what it likes as the hand-back.
if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE
    sys.exit("tool sandbox: the hand-back cannot be protected (prctl)")
shutil.copytree(home_source, os.environ["HOME"], symlinks=True, dirs_exist_ok=True)
listener = socket.create_server(("127.0.0.1", int(port)), backlog=128)
def pump(source, sink):
    try:
        while data := source.recv(1 << 16):
            sink.sendall(data)
    except OSError:
        pass
    for end in (sink, source):
        try:
            end.shutdown(socket.SHUT_WR if end is sink else socket.SHUT_RD)
        except OSError:
            pass
def accept():
    while True:
        client, _ = listener.accept()
        upstream = socket.socket(socket.AF_UNIX)
        try:
            upstream.connect(bridge)
        except OSError:
            client.close()
            upstream.close()
            continue
        for pair in ((client, upstream), (upstream, client)):
            threading.Thread(target=pump, args=pair, daemon=True).start()
threading.Thread(target=accept, daemon=True).start()
code = subprocess.call(command, cwd="/task", stdin=subprocess.DEVNULL)
# What the tool left running is gone before the task directory is read: every process
# in the sandbox's PID namespace but this one and its ancestors (the sandbox's own).
def stat(pid):  # the fields after the command's name: state, parent, ...
    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
def ancestors():
    chain, pid = {os.getpid()}, os.getppid()
    while pid > 0 and pid not in chain:
        chain.add(pid)
        pid = int(stat(pid)[1])
    return chain
keep = ancestors()
for _ in range(100):
    left = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in keep:
            try:
                if stat(entry)[0] != "Z":
                    left.append(int(entry))
                    os.kill(int(entry), signal.SIGKILL)
            except OSError:
                pass
    if not left:
        break
    time.sleep(0.01)
else:
    # They outran the kill (a fork storm): no stream read while they could change it.
    print(f"%(marker)s{len(left)} %(running)s", file=sys.stderr)
    sys.stderr.flush()
    os._exit(%(code)d)
def kept(member):
    # A link (symbolic or hard) to a file inside the task comes back as that file's
    # content; any other link, or a device, not at all.
    if member.issym() or member.islnk():
        real = os.path.realpath(os.path.join("/task", member.name))
        if not real.startswith("/task/") or not os.path.isfile(real):
            return None
        member.type, member.linkname, member.size = tarfile.REGTYPE, "", os.stat(real).st_size
    return member if member.isfile() or member.isdir() else None
try:
    with open(int(out_fd), "wb") as out, tarfile.open(fileobj=out, mode="w|") as tar:
        tar.add("/task", arcname=".", filter=kept)
except OSError as error:
    print(f"%(marker)s{error.strerror}", file=sys.stderr)
    code = %(code)d
sys.stdout.flush()
sys.stderr.flush()
os._exit(code if code >= 0 else 128 - code)
"""


# How the first process says the task directory was not handed back: too large, or
# processes the tool left outran the kill.
_NOT_HANDED_BACK = "tool sandbox: the task directory was not handed back: "
_NOT_HANDED_BACK_CODE = 125
_STILL_RUNNING = "processes it left could not be ended"
_INSIDE = _INSIDE % {
    "marker": _NOT_HANDED_BACK,
    "code": _NOT_HANDED_BACK_CODE,
    "running": _STILL_RUNNING,
}


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """How a tool's run ended, and where what it left in the task directory now is
    (None when it left nothing to judge: stopped, or its tar stream not whole)."""

    outcome: sandbox.Outcome
    result: Path | None
    connections: int
    # Why nothing came back though the tool ended by itself: it left too much, or what
    # it left could not be unpacked.
    problem: str | None = None


class GatewayBridge:
    """The caller's end of the sandbox's network: a Unix socket whose every connection
    is joined to the gateway's address (`host:port` of `base_url`), and nothing else."""

    def __init__(self, base_url: str) -> None:
        address = urlsplit(base_url)
        if address.scheme != "http" or address.hostname is None:
            raise ValueError(f"a tool reaches the gateway over plain http: {base_url}")
        self.host, self.port = address.hostname, address.port or 80
        self.path = address.path.rstrip("/")
        self.connections = 0
        self._server: asyncio.AbstractServer | None = None
        self._directory: tempfile.TemporaryDirectory[str] | None = None

    @property
    def inside_url(self) -> str:
        """The gateway's base URL as the tool in the sandbox reaches it."""
        return f"http://{INSIDE_HOST}{self.path}"

    @property
    def directory(self) -> Path:
        assert self._directory is not None, "the bridge is not open"
        return Path(self._directory.name)

    async def __aenter__(self) -> GatewayBridge:
        self._directory = tempfile.TemporaryDirectory(prefix="eval-bridge-")
        # The sandbox's user (nobody, as root) must reach the socket through its folder.
        os.chmod(self.directory, 0o755)
        socket_path = self.directory / "socket"
        self._server = await asyncio.start_unix_server(self._join, path=str(socket_path))
        os.chmod(socket_path, 0o777)
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
        if self._directory is not None:
            self._directory.cleanup()

    async def _join(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            if writer.can_write_eof():
                writer.write_eof()
            else:
                writer.close()


def run_tool(
    command: Sequence[str],
    project: Path,
    home_files: Mapping[str, str],
    env: Mapping[str, str],
    bridge: GatewayBridge,
    tool_dir: Path,
    result: Path,
    limits: sandbox.Limits = TOOL_LIMITS,
    stop: threading.Event | None = None,
) -> ToolOutcome:
    """Run `command` (a path inside `tool_dir`, the tool's install, mounted read-only) in
    the sandbox on a copy of `project`, with `home_files` (paths under the home) in its
    home and `env` added to its environment; unpack what it left in the task directory
    into `result` (made empty). Blocking: call it in a thread while the bridge serves;
    `stop` set ends the tool at once (it leaves nothing to judge)."""
    with tempfile.TemporaryDirectory(prefix="eval-tool-") as scratch:
        home = Path(scratch) / "home"
        for relative, text in home_files.items():
            path = home / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        home.mkdir(exist_ok=True)
        _readable(Path(scratch))
        tar_path = Path(scratch) / "task.tar"
        with open(tar_path, "wb") as tar_file:
            fd = tar_file.fileno()
            inside = [sys.executable, "-I", "-S", "-c", _INSIDE, f"{_BRIDGE_DIR}/socket"]
            inside += [str(INSIDE_PORT), _HOME_SOURCE, str(fd), *command]
            outcome = sandbox.run(
                inside,
                project,
                limits,
                {"HOME": HOME, **env},
                mounts={_BRIDGE_DIR: bridge.directory, _HOME_SOURCE: home, str(tool_dir): tool_dir},
                pass_fds=(fd,),
                stop=stop,
            )
        problem = _problem(outcome, limits)
        if outcome.stopped is None and problem is None:
            problem = unpack_task(tar_path, result)
            if problem is None:
                return ToolOutcome(outcome, result, bridge.connections)
    return ToolOutcome(outcome, None, bridge.connections, problem)


def _problem(outcome: sandbox.Outcome, limits: sandbox.Limits) -> str | None:
    if outcome.returncode != _NOT_HANDED_BACK_CODE or _NOT_HANDED_BACK not in outcome.stderr:
        return None
    reason = outcome.stderr.split(_NOT_HANDED_BACK, 1)[1].splitlines()[0]
    if reason.endswith(_STILL_RUNNING):
        return f"it left processes running that outran every kill ({reason})"
    return f"it left more than {limits.file_bytes >> 20} MiB in the task directory ({reason})"


def _readable(directory: Path) -> None:
    """The folder readable by the sandbox's user (nobody, when the caller is root)."""
    for root, dirs, files in os.walk(directory):
        os.chmod(root, 0o755)
        for name in files:
            os.chmod(Path(root, name), 0o644)
        for name in dirs:
            os.chmod(Path(root, name), 0o755)


def unpack_task(tar_path: Path, into: Path) -> str | None:
    """The tool's task directory into `into`; why not, when its stream cannot be read.

    Nothing but regular files and directories is made, each at a plain relative path
    under `into` (no `..`, bounded in depth and length), and no link at all: so nothing
    is written outside `into`, whatever the stream holds, and no more than its size.
    (tarfile's own `data` filter is not enough: before Python 3.11.13 a chain of links
    passes it, CVE-2025-4517.)"""
    into.mkdir(parents=True, exist_ok=True)
    # Nothing comes out larger than the stream that holds it: a sparse member (a few
    # bytes standing for gigabytes) is left out.
    room = tar_path.stat().st_size
    try:
        with tarfile.open(tar_path, mode="r:") as tar:
            for member in tar:
                parts = _plain_parts(member.name)
                if parts is None or member.issparse() or not (member.isfile() or member.isdir()):
                    continue
                room -= member.size
                if room < 0:
                    return "what it left in the task directory unpacks larger than its stream"
                target = into.joinpath(*parts)
                if member.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                source = tar.extractfile(member)
                assert source is not None  # a regular file's
                mode = 0o755 if member.mode & 0o100 else 0o644
                flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                with open(os.open(target, flags, mode), "wb") as sink:
                    shutil.copyfileobj(source, sink)
    except (tarfile.TarError, OSError) as exc:
        return f"what it left in the task directory could not be unpacked ({exc})"
    return None


# A member deeper or longer than this is no project's, and would fail the host's own
# path handling (ENAMETOOLONG) when the result is judged.
_MAX_DEPTH, _MAX_NAME, _MAX_PART = 32, 1024, 255


def _plain_parts(name: str) -> tuple[str, ...] | None:
    """A member's name as path parts under the task directory, or None to leave it out."""
    if name.startswith("/") or len(name) > _MAX_NAME:
        return None
    parts = tuple(part for part in name.split("/") if part not in ("", "."))
    if not parts or len(parts) > _MAX_DEPTH or ".." in parts:
        return None
    if any(len(part.encode(errors="surrogateescape")) > _MAX_PART for part in parts):
        return None
    return parts
