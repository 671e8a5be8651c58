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
  Python installation and virtual environment that run it, read-only; a copy of its
  directory at `/task`, on a tmpfs of `Limits.disk_bytes` (parts of it may be the
  directory's own, mounted read-only: the hidden tests); a private `/tmp`; a `/proc`
  that shows its own processes and a minimal `/dev`. Nothing else of the host: no
  `/etc` (no `/etc/shadow`), no home directory, not the gateway's checkout (the virtual
  environment is mounted alone, and the gateway's editable install points into a
  directory that is not there), no host Unix socket. It writes nothing on the host:
  what it writes in `/task` goes with it;
- with an environment of its own (`--clearenv`), and bwrap itself started with an empty
  one, so that no key or token of the caller's is in any process it can see;
- under resource limits: where the caller is root and a cgroup v1 memory and pids
  hierarchy is there, a cgroup of its own bounds the memory of all its processes
  together (files in its tmpfs included) and their number, and a process past the
  memory limit ends the run (`stopped` "memory"); everywhere, util-linux `prlimit`
  bounds each process's address space, file size and open files, and the number of
  processes (counted in its own user namespace), with no core dumps. Without the
  cgroup, the memory of the whole is bounded only by processes x address space
  (`Outcome.total_memory_bytes` says which held);
- under a wall-clock limit: at the limit its PID namespace is killed (the kernel kills
  every process in it when its first process dies), and `run` returns only once every
  process of it is gone; its output goes to files, so that a process holding stdout
  open cannot keep the caller waiting.

The caller's uid decides how it starts. As root, bwrap sets up the namespaces and the
file system, `setpriv` drops to uid 65534 with no capability, and a second bwrap makes
the user namespace: the code runs as the host's `nobody`, never as root (its directory
is handed to that user first, to be copied). As anyone else, one bwrap makes every
namespace, the user's included (the code's processes are then the caller's outside).

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
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from gateway.mcp.stdio_sandbox import arguments_fd, parent_dirs, system_mounts

_BWRAP = shutil.which("bwrap")
_PRLIMIT = shutil.which("prlimit")
_SETPRIV = shutil.which("setpriv")
# The sandbox's user and group, inside (and outside when the caller is root): nobody.
SANDBOX_UID = SANDBOX_GID = 65534
# Where the copy of the command's directory is, inside (a tmpfs of `Limits.disk_bytes`).
TASK_DIR = "/task"
# The directory as the caller gave it, read-only inside: what `/task` is copied from.
_SOURCE_DIR = "/.task-source"
_TMP_DIR = "/tmp"
# How long the kernel gets to tear down a killed sandbox before the caller stops waiting.
_TEARDOWN_S = 10.0
_INSTALL = "install bubblewrap (apt-get install bubblewrap; scripts/bootstrap.sh does)"
# Where the cgroup hierarchies are mounted, and this process's cgroup in each: a run's
# cgroup is made below the caller's own.
_MOUNTINFO = Path("/proc/self/mountinfo")
_OWN_CGROUPS = Path("/proc/self/cgroup")
# A run's cgroup is named GROUP_PREFIX + the caller's pid + a random part.
GROUP_PREFIX = "gateway-sandbox-"
# Processes in the sandbox's cgroup that are not the command's: the outer bwrap's
# monitor and the first process of its PID namespace, and the second bwrap's monitor.
_BWRAP_PROCESSES = 3
# How often the run's cgroup is asked whether the kernel killed one of its processes
# for memory: the run is then stopped whole, not left to go on without it.
_OOM_POLL_S = 0.1
# How often a run that may be stopped (`run(stop=...)`) looks whether it is.
_STOP_POLL_S = 0.1
# Adds the launching shell to each cgroup.procs before "--", then runs the rest in its
# place: the sandbox's first process, and so everything it starts, is in the cgroup
# before any code of the sandbox's runs.
_JOIN = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
# The first thing run in the sandbox, as its user and under its limits: copies the
# caller's directory (regular files, directories and symbolic links; `--` ends the
# read-only parts, left where they are mounted) into /task, then runs the command.
_COPY = """
import os, shutil, signal, stat, sys
source, target, *rest = sys.argv[1:]
end = rest.index("--")
kept = {os.path.normpath(os.path.join(source, part)) for part in rest[:end]}
command = rest[end + 1:]
def copy(source, target):
    for entry in os.scandir(source):
        into = os.path.join(target, entry.name)
        if os.path.normpath(entry.path) in kept:
            continue
        mode = entry.stat(follow_symlinks=False).st_mode
        if stat.S_ISLNK(mode):
            os.symlink(os.readlink(entry.path), into)
        elif stat.S_ISDIR(mode):
            made = not os.path.isdir(into)
            if made:
                os.mkdir(into)
            copy(entry.path, into)
            if made:
                shutil.copystat(entry.path, into)
        elif stat.S_ISREG(mode):
            shutil.copy2(entry.path, into)
try:
    copy(source, target)
except OSError as error:
    sys.exit(f"sandbox: the task directory could not be copied into {target}: {error}")
# Python ignores these, and an ignored signal stays ignored across exec: the command
# gets them as any program does (killed at the file size limit, not EFBIG only).
for name in ("SIGPIPE", "SIGXFSZ"):
    signal.signal(getattr(signal, name), signal.SIG_DFL)
os.execvp(command[0], command)
"""


class SandboxUnavailable(RuntimeError):
    """No sandbox can run here: untrusted code is refused rather than run without one."""


@dataclass(frozen=True, slots=True)
class Limits:
    """What a sandboxed command may use."""

    wall_s: float = 60.0
    # All its processes together, with the files in its tmpfs, where a cgroup can hold
    # them (the caller is root); and each process's address space, everywhere.
    memory_bytes: int = 1 << 30
    # Each process's address space, where it differs from `memory_bytes`: a JavaScript
    # runtime (a coding tool) reserves far more than it uses, and is bounded by the
    # cgroup's `memory_bytes` instead.
    address_space_bytes: int | None = None
    # In the sandbox, all together. Without a cgroup its memory is bounded only by
    # processes x memory_bytes: kept low for that bound to mean something.
    processes: int = 16
    file_bytes: int = 64 << 20  # the largest file it may write (and the size of its /tmp)
    disk_bytes: int = 256 << 20  # all it may write in /task, the copy of its directory
    open_files: int = 256
    # Of stdout and stderr, each: the rest is dropped.
    output_bytes: int = 1 << 20
    network: bool = False


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a sandboxed command ended."""

    returncode: int | None
    # None when it exited by itself; else why it was stopped or died: "timeout",
    # "memory" (the kernel killed one of its processes at the memory limit, and the run
    # was stopped), "file_size", or "signal N".
    stopped: str | None
    stdout: str
    stderr: str
    duration_s: float
    # Whether it ran without a network (a namespace of its own).
    isolated_network: bool
    # The most memory the run could take from the host: its memory limit where its
    # cgroup held it all (its processes and the files in its tmpfs); where no cgroup
    # could be made (the caller is not root, or there is no cgroup v1 memory and pids
    # hierarchy), processes x the memory limit, each process's address space being all
    # that was bounded, and its two tmpfs (/task and /tmp) besides.
    total_memory_bytes: int

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
    stop: threading.Event | None = None,
) -> Outcome:
    """Run `command` in the sandbox, in `directory` (at `TASK_DIR` inside), under `limits`.

    `directory` is copied into the sandbox, onto a tmpfs of `limits.disk_bytes`: what
    the command writes goes with the sandbox, and `directory` is left as it was (what
    the caller needs back comes through `pass_fds`, stdout or stderr). `env` adds to its
    bare environment; `read_only` names parts of `directory` (relative paths) that are
    not copied but mounted read-only in their place; `mounts` maps more paths inside to
    host directories, read-only; `pass_fds` are descriptors of the caller's handed to
    the command (the judge's channel for pytest's results). The command and its paths
    are as seen inside: the Python that runs it is at the same path there. Setting
    `stop` (from another thread) ends the run at once, as "cancelled".
    Raises SandboxUnavailable where no sandbox can be made.
    """
    problem = unavailable()
    if problem is not None:
        raise SandboxUnavailable(problem)
    return _run(command, directory, limits, env, read_only, mounts or {}, pass_fds, stop)


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
    stop: threading.Event | None = None,
) -> Outcome:
    privileged = _caller_is_root()
    if privileged:
        _hand_over(directory, read_only)
    # Only root may make cgroups here; anyone else keeps the per-process bounds.
    group = _Group.create(limits) if privileged else None
    info_read, info_write = os.pipe()
    env_fd = arguments_fd(_environment(env))
    argv = [
        *(group.joining() if group is not None else []),
        *_outer(directory, limits, env_fd, read_only, mounts, info_write, privileged),
        *(_drop_to_nobody() if privileged else []),
        *_prlimit(limits),
        "--",
        *_copying(read_only),
        *command,
    ]
    started = time.monotonic()
    with (
        _removing(group),
        _output_file() as stdout,
        _output_file() as stderr,
        _closing(info_read),
    ):
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
                pass_fds=(info_write, env_fd, *pass_fds),
                start_new_session=True,
            )
        finally:
            os.close(info_write)
            os.close(env_fd)
        try:
            stopped = _wait(process, limits.wall_s, group, stop)
        finally:
            # Normally a no-op: bwrap exits only once its PID namespace is empty.
            _end(process, info_read)
        duration = time.monotonic() - started
        out, err = _read(stdout, limits.output_bytes), _read(stderr, limits.output_bytes)
        # Also when the kill came just before the end: a process of it was killed for
        # its memory, whatever the others did afterwards.
        if group is not None and group.oom_kills():
            stopped = "memory"
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
        total_memory_bytes=_total_memory(limits, contained=group is not None),
    )


def _total_memory(limits: Limits, *, contained: bool) -> int:
    """What `Outcome.total_memory_bytes` says: all the run could take from the host."""
    if contained:
        return limits.memory_bytes
    per_process = limits.address_space_bytes or limits.memory_bytes
    return limits.processes * per_process + limits.disk_bytes + limits.file_bytes


def _wait(
    process: subprocess.Popen[bytes],
    wall_s: float,
    group: _Group | None,
    stop: threading.Event | None,
) -> str | None:
    """Wait for the sandbox to end: None when it did by itself, "timeout" at the wall
    limit, "memory" as soon as the kernel killed one of its processes for memory,
    "cancelled" once `stop` is set."""
    deadline = time.monotonic() + wall_s
    # A pidfd, not Popen.wait's timeout: that polls with sleeps growing to 50 ms, which
    # a run of 35 ms would wait out to 65. The pid is not reused: it is not reaped yet.
    pidfd = os.pidfd_open(process.pid)
    try:
        while (remaining := deadline - time.monotonic()) > 0:
            step = remaining if group is None else min(remaining, _OOM_POLL_S)
            step = step if stop is None else min(step, _STOP_POLL_S)
            if select.select([pidfd], [], [], step)[0]:
                process.wait()
                return None
            if group is not None and group.oom_kills():
                return "memory"
            if stop is not None and stop.is_set():
                return "cancelled"
        return "timeout"
    finally:
        os.close(pidfd)


def _caller_is_root() -> bool:
    return os.geteuid() == 0


def _outer(
    directory: Path,
    limits: Limits,
    env_fd: int,
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
    argv += ["--clearenv", "--args", str(env_fd)]
    argv += _filesystem(directory, limits, read_only, mounts)
    if not privileged:
        # As root, this bwrap has no CAP_DAC_OVERRIDE left to enter nobody's directory:
        # the second one does.
        argv += ["--chdir", TASK_DIR]
    return argv


def _filesystem(
    directory: Path, limits: Limits, read_only: Sequence[str], mounts: Mapping[str, Path]
) -> list[str]:
    """The sandbox's view: the system and Python read-only, a tmpfs for the task's copy, a
    private /tmp, and nothing else of the host."""
    argv = system_mounts()
    # The private /tmp before anything is mounted below it: a virtual environment under
    # /tmp (a checkout there) is mounted on top of it, not hidden by it.
    argv += ["--perms", "1777", "--size", str(limits.file_bytes), "--tmpfs", _TMP_DIR]
    made: set[str] = {"/", "/usr", _TMP_DIR}
    for inside, host in [*((p, p) for p in _python_paths()), *mounts.items()]:
        argv += [*parent_dirs(inside, made), "--ro-bind", str(host), inside]
    # The directory itself is never writable: the code writes in a copy of it, on a
    # tmpfs whose size bounds all it writes (as one file's size is bounded by prlimit).
    # World-writable: the copy is made by the sandbox's user, and as root bwrap mounts
    # it as root.
    argv += ["--ro-bind", str(directory), _SOURCE_DIR]
    argv += ["--perms", "0777", "--size", str(limits.disk_bytes), "--tmpfs", TASK_DIR]
    made.add(TASK_DIR)
    for part in read_only:
        inside = str(PurePosixPath(TASK_DIR) / part)
        argv += [*parent_dirs(inside, made, "0777"), "--ro-bind", str(directory / part), inside]
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
        f"--as={limits.address_space_bytes or limits.memory_bytes}",
        f"--fsize={limits.file_bytes}",
        f"--nofile={limits.open_files}",
        f"--nproc={limits.processes}",
        "--core=0",
    ]


def _copying(read_only: Sequence[str]) -> list[str]:
    """The command's prefix that copies the caller's directory into /task first (in the
    sandbox, as its user, under its limits), leaving out the read-only parts."""
    return [sys.executable, "-I", "-S", "-c", _COPY, _SOURCE_DIR, TASK_DIR, *read_only, "--"]


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
    """Give the task directory to the sandbox's user (the caller is root), so that it can
    read what it copies (the directory itself is mounted read-only). Read-only parts,
    not copied, stay the caller's."""
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


@dataclass(frozen=True, slots=True)
class _Group:
    """The run's own cgroup, in the cgroup v1 memory and pids hierarchies: the memory of
    all its processes together (no swap) and their number are bounded there, whatever
    user they run as. Made below the caller's own cgroups, so that any bound on the
    caller holds on the sandbox too."""

    name: str
    memory: Path
    pids: Path

    @classmethod
    def create(cls, limits: Limits) -> _Group | None:
        """A new cgroup under `limits`, or None where none can be made (no such
        hierarchy, or not allowed to write it)."""
        memory, pids = _own_cgroup("memory"), _own_cgroup("pids")
        if memory is None or pids is None:
            return None
        _remove_stale(memory, pids)
        name = f"{GROUP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        group = cls(name, memory / name, pids / name)
        try:
            group.memory.mkdir()
            group.pids.mkdir()
            _write(group.memory / "memory.limit_in_bytes", limits.memory_bytes)
            # Memory and swap together: pushed to swap, its memory would still be there.
            swap = group.memory / "memory.memsw.limit_in_bytes"
            if swap.exists():
                _write(swap, limits.memory_bytes)
            _write(group.pids / "pids.max", limits.processes + _BWRAP_PROCESSES)
        except OSError:
            group.remove()
            return None
        return group

    def joining(self) -> list[str]:
        """The launcher that puts the sandbox's first process in this cgroup."""
        procs = [str(directory / "cgroup.procs") for directory in (self.memory, self.pids)]
        return ["/bin/sh", "-c", _JOIN, "sandbox", *procs, "--"]

    def oom_kills(self) -> int:
        """How many of its processes the kernel killed at its memory limit."""
        with contextlib.suppress(OSError):
            for line in (self.memory / "memory.oom_control").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return 0

    def remove(self) -> None:
        """Kill whatever is still in it (nothing, normally: its PID namespace went first)
        and remove it."""
        deadline = time.monotonic() + _TEARDOWN_S
        for directory in (self.memory, self.pids):
            while directory.exists():
                self._kill_members(directory)
                try:
                    directory.rmdir()
                except FileNotFoundError:
                    break
                except OSError:
                    # Busy for a few milliseconds after its last process was reaped.
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.001)

    def _kill_members(self, directory: Path) -> None:
        try:
            members = [int(pid) for pid in (directory / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return
        for pid in members:
            with contextlib.suppress(OSError):
                pidfd = os.pidfd_open(pid)
                try:
                    # Still a member once held by its pidfd: not a pid reused since.
                    if self.name in Path(f"/proc/{pid}/cgroup").read_text():
                        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                finally:
                    os.close(pidfd)


def _remove_stale(*parents: Path) -> None:
    """Remove the empty cgroups that a caller killed before it could left behind (its
    sandboxes died with it: bwrap's --die-with-parent). Those of callers still alive,
    and any with a process in it, are left alone."""
    for parent in parents:
        with contextlib.suppress(OSError):
            for directory in parent.glob(f"{GROUP_PREFIX}*"):
                creator = directory.name.removeprefix(GROUP_PREFIX).partition("-")[0]
                if creator.isdigit() and not Path(f"/proc/{creator}").exists():
                    with contextlib.suppress(OSError):
                        directory.rmdir()  # refused while it has a process


def _own_cgroup(controller: str) -> Path | None:
    """The directory of this process's own cgroup in the cgroup v1 hierarchy of
    `controller`, where that hierarchy is mounted; else None."""
    try:
        own = _OWN_CGROUPS.read_text().splitlines()
        mounts = _MOUNTINFO.read_text().splitlines()
    except OSError:
        return None
    path = next(
        (
            fields[2]
            for fields in (line.split(":", 2) for line in own)
            if len(fields) == 3 and controller in fields[1].split(",")
        ),
        None,
    )
    if path is None:
        return None
    for line in mounts:
        # "id parent major:minor root mount-point options [optional...] - type source super"
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] != "cgroup":
            continue
        if controller not in tail[2].split(","):
            continue
        root, mount_point = PurePosixPath(fields[3]), Path(fields[4])
        inside = PurePosixPath(path)
        if inside == root or root in inside.parents:
            directory = mount_point / inside.relative_to(root)
            return directory if directory.is_dir() else None
    return None


def _write(path: Path, value: int) -> None:
    path.write_text(str(value))


@contextlib.contextmanager
def _removing(group: _Group | None) -> Iterator[None]:
    try:
        yield
    finally:
        if group is not None:
            group.remove()


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
