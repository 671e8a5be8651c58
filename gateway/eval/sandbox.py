"""Run untrusted code (a model's solution and a task's hidden tests) under limits.

A command runs in a directory of its own, in a new session (so that every process it
starts is killed with it), with:

- a wall-clock limit, after which the whole process group is killed;
- resource limits (util-linux `prlimit`, so that nothing runs in the forked child
  before exec and threads are safe): address space, file size, open files, no core
  dumps, and processes (`RLIMIT_NPROC`, which root is exempt from);
- where the caller may make one, a cgroup of its own whose `pids.max` bounds its
  processes for any user (a fork bomb run as root too), and whose members are all
  killed at the end;
- an environment of its own: PATH, HOME (its directory), a locale and nothing else,
  so no key or token of the caller's reaches it;
- no network, where the machine allows a network namespace (`unshare --net`): then
  only an unconfigured loopback exists inside.

It runs as the caller's user: the interpreter of the caller's virtual environment
(under root's home here) is not one that another user may run.

Whatever the code does (loops, forks without end, fills the disk, runs out of memory),
the caller gets an `Outcome` that says what happened and why, never an exception.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

_UNSHARE = shutil.which("unshare")
_PRLIMIT = shutil.which("prlimit")
# cgroup v1's pids controller, where this machine has it.
PIDS_ROOT = Path("/sys/fs/cgroup/pids")
# Adds the shell to the cgroup ($1), then runs the command in its place.
_JOIN = 'echo $$ > "$1" && shift && exec "$@"'


@dataclass(frozen=True, slots=True)
class Limits:
    """What a sandboxed command may use."""

    wall_s: float = 60.0
    memory_bytes: int = 1 << 30  # address space
    processes: int = 64  # of the sandbox's user, all together
    file_bytes: int = 64 << 20  # the largest file it may write
    open_files: int = 256
    # Of stdout and stderr, each: the rest is dropped.
    output_bytes: int = 1 << 20
    network: bool = False


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a sandboxed command ended."""

    returncode: int | None
    # None when it exited by itself; else why it was stopped or died: "timeout",
    # "file_size", or "signal N".
    stopped: str | None
    stdout: str
    stderr: str
    duration_s: float
    # Whether it ran without a network (a namespace of its own).
    isolated_network: bool

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.stopped is None


@functools.cache
def network_isolation_available() -> bool:
    """Whether this machine lets a command run in a network namespace of its own."""
    if _UNSHARE is None:
        return False
    try:
        probe = subprocess.run([_UNSHARE, "--net", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def run(
    command: Sequence[str],
    directory: Path,
    limits: Limits = Limits(),
    env: Mapping[str, str] | None = None,
) -> Outcome:
    """Run `command` in `directory` under `limits`; `env` adds to its bare environment."""
    if _PRLIMIT is None:
        raise RuntimeError("prlimit (util-linux) is needed to run sandboxed code")
    isolate = not limits.network and network_isolation_available()
    argv = [_PRLIMIT, *_prlimit_options(limits), "--", *command]
    if isolate and _UNSHARE is not None:
        argv = [_UNSHARE, "--net", "--", *argv]
    group = _pids_group(limits.processes)
    if group is None and os.geteuid() == 0:
        # Root is exempt from RLIMIT_NPROC: without a cgroup a fork bomb would be free.
        raise RuntimeError(
            "cannot bound the processes of sandboxed code: running as root, and no pids "
            f"cgroup can be made under {PIDS_ROOT}"
        )
    if group is not None:
        argv = ["/bin/sh", "-c", _JOIN, "sandbox", str(group / "cgroup.procs"), *argv]
    started = time.monotonic()
    process = subprocess.Popen(
        argv,
        cwd=directory,
        env=_environment(directory, env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    stopped = None
    try:
        stdout, stderr = process.communicate(timeout=limits.wall_s)
    except subprocess.TimeoutExpired:
        stopped = "timeout"
        _kill_group(process.pid)
        stdout, stderr = process.communicate()
    finally:
        _kill_group(process.pid)  # what it left running
        if group is not None:
            _remove_group(group)
    duration = time.monotonic() - started
    code = process.returncode
    if stopped is None and code is not None:
        # Killed by a signal: -N from the process itself, 128 + N through a shell.
        number = -code if code < 0 else code - 128 if code > 128 else 0
        if number:
            stopped = "file_size" if number == signal.SIGXFSZ else f"signal {number}"
    return Outcome(
        returncode=code,
        stopped=stopped,
        stdout=_text(stdout, limits.output_bytes),
        stderr=_text(stderr, limits.output_bytes),
        duration_s=duration,
        isolated_network=isolate,
    )


def _environment(directory: Path, extra: Mapping[str, str] | None) -> dict[str, str]:
    python_bin = str(Path(sys.executable).parent)
    return {
        "PATH": f"{python_bin}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(directory),
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
        **(extra or {}),
    }


def _prlimit_options(limits: Limits) -> list[str]:
    return [
        f"--as={limits.memory_bytes}",
        f"--fsize={limits.file_bytes}",
        f"--nofile={limits.open_files}",
        f"--nproc={limits.processes}",
        "--core=0",
    ]


def _pids_group(limit: int) -> Path | None:
    """A new cgroup that holds at most `limit` processes, or None where none can be made."""
    if not PIDS_ROOT.is_dir():
        return None
    group = PIDS_ROOT / f"gateway-sandbox-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        group.mkdir()
        (group / "pids.max").write_text(str(limit))
    except OSError:
        with contextlib.suppress(OSError):
            group.rmdir()
        return None
    return group


def _remove_group(group: Path) -> None:
    """Kill whatever is left in the cgroup (even outside the process group), then
    remove it."""
    for _ in range(100):
        try:
            members = (group / "cgroup.procs").read_text().split()
        except OSError:
            return
        if not members:
            break
        for pid in members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.01)
    with contextlib.suppress(OSError):
        group.rmdir()


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _text(raw: bytes, limit: int) -> str:
    return raw[:limit].decode(errors="replace")
