"""Run untrusted code (a model's solution and a task's hidden tests) in a sandbox.

The sandbox is bubblewrap (`bwrap`), a tool made for this and maintained with Flatpak,
not limits of our own. A command runs:

- as an unprivileged user: uid and gid 65534 ("nobody") inside, and outside too when
  the caller is root (below), with no capability and `no_new_privs`;
- in new mount, PID, IPC, UTS, cgroup, user and network namespaces: it sees only its
  own processes, no network (an unconfigured loopback of its own, so nothing of the
  host's is listening there), no abstract Unix socket of the host, and creates no
  further user namespace;
- in a file system of its own: the system's programs and libraries (`/usr`) and the
  Python installation and virtual environment that run it, read-only; its directory
  writable at `/task` (parts of it may be mounted read-only: the hidden tests); a
  private `/tmp`; a `/proc` that shows its own processes and a minimal `/dev`. Nothing
  else of the host: no `/etc` (no `/etc/shadow`), no home directory, not the gateway's
  checkout (the virtual environment is mounted alone, and the gateway's editable
  install points into a directory that is not there), no host Unix socket;
- with an environment of its own (`--clearenv`), and bwrap itself started with an empty
  one, so that no key or token of the caller's is in any process it can see;
- under resource limits (util-linux `prlimit`): address space, file size, open files,
  processes (counted in its own user namespace, so that a fork bomb is held whoever the
  caller is), no core dumps;
- under a wall-clock limit: at the limit its PID namespace is killed (the kernel kills
  every process in it when its first process dies), and `run` returns only once every
  process of it is gone; its output goes to files, so that a process holding stdout
  open cannot keep the caller waiting.

The caller's uid decides how it starts. As root, bwrap sets up the namespaces and the
file system, `setpriv` drops to uid 65534 with no capability, and a second bwrap makes
the user namespace: the code runs as the host's `nobody`, never as root, and its
directory is handed to that user first. As anyone else, one bwrap makes every
namespace, the user's included (the code's files are then the caller's outside).

Without bwrap (or where it cannot make its namespaces) `run` raises `SandboxUnavailable`:
code under evaluation is never run unsandboxed. Whatever the code does (loops, forks
without end, fills the disk, runs out of memory, leaves processes behind), the caller
gets an `Outcome` that says what happened and why.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

_BWRAP = shutil.which("bwrap")
_PRLIMIT = shutil.which("prlimit")
_SETPRIV = shutil.which("setpriv")
# The sandbox's user and group, inside (and outside when the caller is root): nobody.
SANDBOX_UID = SANDBOX_GID = 65534
# Where the command's directory is, inside.
TASK_DIR = "/task"
_TMP_DIR = "/tmp"
# Mounted from the host read-only when they are directories; kept as the same symlinks
# when they are symlinks (a merged /usr).
_SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# How long the kernel gets to tear down a killed sandbox before the caller stops waiting.
_TEARDOWN_S = 10.0
_INSTALL = "install bubblewrap (apt-get install bubblewrap; scripts/bootstrap.sh does)"


class SandboxUnavailable(RuntimeError):
    """No sandbox can run here: untrusted code is refused rather than run without one."""


@dataclass(frozen=True, slots=True)
class Limits:
    """What a sandboxed command may use."""

    wall_s: float = 60.0
    memory_bytes: int = 1 << 30  # address space
    processes: int = 64  # in the sandbox, all together
    file_bytes: int = 64 << 20  # the largest file it may write (and the size of its /tmp)
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


def run(
    command: Sequence[str],
    directory: Path,
    limits: Limits = Limits(),
    env: Mapping[str, str] | None = None,
    *,
    read_only: Sequence[str] = (),
    mounts: Mapping[str, Path] | None = None,
    pass_fds: Sequence[int] = (),
) -> Outcome:
    """Run `command` in the sandbox, in `directory` (at `TASK_DIR` inside), under `limits`.

    `env` adds to its bare environment; `read_only` names parts of `directory` (relative
    paths) mounted read-only over it; `mounts` maps more paths inside to host
    directories, read-only; `pass_fds` are descriptors of the caller's handed to the
    command (the judge's channel for pytest's results). The command and its paths are
    as seen inside: the Python that runs it is at the same path there.
    Raises SandboxUnavailable where no sandbox can be made.
    """
    problem = unavailable()
    if problem is not None:
        raise SandboxUnavailable(problem)
    return _run(command, directory, limits, env, read_only, mounts or {}, pass_fds)


@functools.cache
def unavailable() -> str | None:
    """Why no sandbox can run on this machine, or None: bwrap and the tools it is used with
    must be installed, and bwrap must be able to make its namespaces here (a trial run)."""
    missing = [
        name
        for name, found in (("bwrap", _BWRAP), ("prlimit", _PRLIMIT), ("setpriv", _SETPRIV))
        if found is None and (name != "setpriv" or _caller_is_root())
    ]
    if missing:
        found = ", ".join(missing)
        return f"{found} not found: {_INSTALL}; code under evaluation is not run without a sandbox"
    with tempfile.TemporaryDirectory(prefix="sandbox-probe-") as scratch:
        # The interpreter itself, as the judge runs it: a sandbox that cannot see it
        # (a mount hidden by another) is no sandbox to judge in.
        probe = [sys.executable, "-c", "pass"]
        outcome = _run(probe, Path(scratch), Limits(wall_s=30.0), None, (), {}, ())
    if not outcome.ok:
        detail = (outcome.stderr.strip() or f"exit status {outcome.returncode}").splitlines()[-1]
        return f"bwrap cannot make a sandbox here ({detail}); code under evaluation is not run"
    return None


def _run(
    command: Sequence[str],
    directory: Path,
    limits: Limits,
    env: Mapping[str, str] | None,
    read_only: Sequence[str],
    mounts: Mapping[str, Path],
    pass_fds: Sequence[int],
) -> Outcome:
    privileged = _caller_is_root()
    if privileged:
        _hand_over(directory, read_only)
    info_read, info_write = os.pipe()
    argv = [
        *_outer(directory, limits, _environment(env), read_only, mounts, info_write, privileged),
        *(_drop_to_nobody() if privileged else []),
        *_prlimit(limits),
        "--",
        *command,
    ]
    started = time.monotonic()
    stopped = None
    with _output_file() as stdout, _output_file() as stderr, _closing(info_read):
        try:
            process = subprocess.Popen(
                argv,
                cwd="/",
                # bwrap's own environment is visible to the sandbox (its first process
                # is a bwrap): it gets nothing of the caller's either.
                env={"PATH": "/usr/bin:/bin"},
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                pass_fds=(info_write, *pass_fds),
                start_new_session=True,
            )
        finally:
            os.close(info_write)
        try:
            process.wait(timeout=limits.wall_s)
        except subprocess.TimeoutExpired:
            stopped = "timeout"
        finally:
            # Normally a no-op: bwrap exits only once its PID namespace is empty.
            _end(process, info_read)
        duration = time.monotonic() - started
        out, err = _read(stdout, limits.output_bytes), _read(stderr, limits.output_bytes)
    code = process.returncode
    if stopped is None and code is not None:
        # Killed by a signal: bwrap exits with 128 + N, as a shell does.
        number = -code if code < 0 else code - 128 if code > 128 else 0
        if number:
            stopped = "file_size" if number == signal.SIGXFSZ else f"signal {number}"
    return Outcome(
        returncode=code,
        stopped=stopped,
        stdout=out,
        stderr=err,
        duration_s=duration,
        isolated_network=not limits.network,
    )


def _caller_is_root() -> bool:
    return os.geteuid() == 0


def _outer(
    directory: Path,
    limits: Limits,
    env: Mapping[str, str],
    read_only: Sequence[str],
    mounts: Mapping[str, Path],
    info_fd: int,
    privileged: bool,
) -> list[str]:
    """The first bwrap: namespaces, the file system, the environment."""
    assert _BWRAP is not None
    argv = [_BWRAP, "--die-with-parent", "--new-session", "--info-fd", str(info_fd)]
    argv += ["--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try"]
    if not limits.network:
        argv.append("--unshare-net")
    if privileged:
        # The user namespace comes after the drop to nobody (the second bwrap), so that
        # nobody inside is nobody outside; this one keeps only what `setpriv` needs.
        argv += ["--cap-drop", "ALL"]
        argv += [
            arg for cap in ("SETUID", "SETGID", "SETPCAP") for arg in ("--cap-add", f"CAP_{cap}")
        ]
    else:
        argv += ["--unshare-user", "--disable-userns", "--uid", str(SANDBOX_UID)]
        argv += ["--gid", str(SANDBOX_GID), "--cap-drop", "ALL"]
    argv.append("--clearenv")
    for name, value in env.items():
        argv += ["--setenv", name, value]
    argv += _filesystem(directory, limits, read_only, mounts)
    if not privileged:
        # As root, this bwrap has no CAP_DAC_OVERRIDE left to enter nobody's directory:
        # the second one does.
        argv += ["--chdir", TASK_DIR]
    return argv


def _filesystem(
    directory: Path, limits: Limits, read_only: Sequence[str], mounts: Mapping[str, Path]
) -> list[str]:
    """The sandbox's view: the system and Python read-only, the task writable, a private
    /tmp, and nothing else of the host."""
    argv = ["--ro-bind", "/usr", "/usr"]
    for path in _SYSTEM_LINKS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    # The private /tmp before anything is mounted below it: a virtual environment under
    # /tmp (a checkout there) is mounted on top of it, not hidden by it.
    argv += ["--perms", "1777", "--size", str(limits.file_bytes), "--tmpfs", _TMP_DIR]
    made: set[str] = {"/", "/usr", _TMP_DIR}
    for inside, host in [*((p, p) for p in _python_paths()), *mounts.items()]:
        argv += [*_parents(inside, made), "--ro-bind", str(host), inside]
    argv += ["--bind", str(directory), TASK_DIR]
    for part in read_only:
        inside = str(PurePosixPath(TASK_DIR) / part)
        argv += ["--ro-bind", str(directory / part), inside]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    return argv


def _python_paths() -> list[str]:
    """The Python installation and the virtual environment running this process (the
    sandbox runs the same interpreter), where they are outside /usr."""
    found: list[str] = []
    for prefix in (sys.base_prefix, sys.prefix):
        for path in dict.fromkeys((os.path.abspath(prefix), os.path.realpath(prefix))):
            if not path.startswith("/usr/") and path not in found:
                found.append(path)
    return found


def _parents(path: str, made: set[str]) -> list[str]:
    """`--dir` for each missing parent of `path`, readable by the sandbox's user (bwrap
    makes them 0700 otherwise, owned by root inside)."""
    argv: list[str] = []
    for parent in reversed(PurePosixPath(path).parents):
        if str(parent) not in made:
            made.add(str(parent))
            argv += ["--perms", "0755", "--dir", str(parent)]
    return argv


def _drop_to_nobody() -> list[str]:
    """As root: become uid 65534 with no capability (none can come back: empty bounding
    set, no_new_privs), then a second bwrap makes the user namespace."""
    assert _SETPRIV is not None and _BWRAP is not None
    uid, gid = str(SANDBOX_UID), str(SANDBOX_GID)
    return [
        _SETPRIV, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--inh-caps=-all",
        "--bounding-set=-all", "--no-new-privs", "--",
        _BWRAP, "--unshare-user", "--disable-userns", "--uid", uid, "--gid", gid,
        "--cap-drop", "ALL", "--die-with-parent", "--bind", "/", "/", "--dev", "/dev",
        "--proc", "/proc", "--chdir", TASK_DIR,
    ]  # fmt: skip


def _prlimit(limits: Limits) -> list[str]:
    # Inside the user namespace, so that the process limit counts the sandbox's own.
    assert _PRLIMIT is not None
    return [
        "--",
        _PRLIMIT,
        f"--as={limits.memory_bytes}",
        f"--fsize={limits.file_bytes}",
        f"--nofile={limits.open_files}",
        f"--nproc={limits.processes}",
        "--core=0",
    ]


def _environment(extra: Mapping[str, str] | None) -> dict[str, str]:
    python_bin = str(Path(sys.executable).parent)
    return {
        "PATH": f"{python_bin}:/usr/local/bin:/usr/bin:/bin",
        # A private, empty home: nothing the task directory holds is read as the user's
        # configuration.
        "HOME": _TMP_DIR,
        "TMPDIR": _TMP_DIR,
        "USER": "nobody",
        "LOGNAME": "nobody",
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
        **(extra or {}),
    }


def _hand_over(directory: Path, read_only: Sequence[str]) -> None:
    """Give the task directory to the sandbox's user (the caller is root): it may write
    there and nowhere else. Read-only parts stay the caller's."""
    kept = {directory / part for part in read_only}
    os.chown(directory, SANDBOX_UID, SANDBOX_GID)
    for root, dirs, files in os.walk(directory):
        dirs[:] = [name for name in dirs if Path(root, name) not in kept]
        for name in (*dirs, *files):
            os.chown(Path(root, name), SANDBOX_UID, SANDBOX_GID, follow_symlinks=False)


def _end(process: subprocess.Popen[bytes], info_fd: int) -> None:
    """Kill what is left of the sandbox and wait until it is gone. Its first process
    (bwrap's child, PID 1 of its namespace) is killed: the kernel then kills every other
    one and lets it exit only once they all have, so its exit means the end of all."""
    if process.poll() is not None:
        return
    child = _child_pid(info_fd)
    if child is not None:
        with contextlib.suppress(OSError):
            pidfd = os.pidfd_open(child)
            try:
                if process.poll() is None:  # still bwrap's child: not a reused pid
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                    select.select([pidfd], [], [], _TEARDOWN_S)
            finally:
                os.close(pidfd)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _child_pid(info_fd: int) -> int | None:
    """The host pid of the sandbox's first process, from bwrap's `--info-fd` report."""
    os.set_blocking(info_fd, False)
    data = b""
    with contextlib.suppress(OSError):
        while chunk := os.read(info_fd, 4096):
            data += chunk
    try:
        info, _ = json.JSONDecoder().raw_decode(data.decode(errors="replace"))
        return int(info["child-pid"])
    except (ValueError, KeyError, TypeError):
        return None


@contextlib.contextmanager
def _closing(fd: int) -> Iterator[None]:
    try:
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def _output_file() -> Iterator[IO[bytes]]:
    """An unnamed file for stdout or stderr: nothing to wait on, and no path to it."""
    with tempfile.TemporaryFile() as file:
        yield file


def _read(file: IO[bytes], limit: int) -> str:
    file.seek(0)
    return file.read(limit).decode(errors="replace")
