"""The sandbox holds against code that misbehaves (it loops, forks without end, eats
memory, fills the disk) and against code that tries to get out: each escape a hostile
tenant's code was found to make runs here, in the real sandbox, and is shown to fail.
Each is a real bwrap; each ends in an `Outcome` that says what happened. Every hostile
payload runs through `sandbox.run`, never on the host."""

from __future__ import annotations

import ast
import dataclasses
import functools
import os
import socket
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway_tools.eval import sandbox
from gateway_tools.eval.records import Attempt
from gateway_tools.eval.runner import judge_answer
from gateway_tools.eval.sandbox import (
    GROUP_PREFIX,
    SANDBOX_UID,
    Limits,
    Outcome,
    SandboxUnavailable,
    run,
)
from gateway_tools.eval.suite import load_task
from tests.unit.eval.tasks import write_task

PYTHON = sys.executable
ROOT = Path(__file__).resolve().parents[3]
TENANTS = ROOT / "config" / "tenants.yaml"
# Tight enough that each test ends quickly; a wall limit far above what a good command
# takes, so that only a command that misbehaves reaches it.
TIGHT = Limits(
    wall_s=20, memory_bytes=512 << 20, processes=32, file_bytes=1 << 20, disk_bytes=64 << 20
)


def python(
    code: str, directory: Path, limits: Limits = TIGHT, pass_fds: tuple[int, ...] = ()
) -> Outcome:
    return run([PYTHON, "-c", code], directory, limits, pass_fds=pass_fds)


def leftovers(marker: str) -> str:
    """Processes on this machine whose command line holds `marker`."""
    return subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout


def cgroups_left() -> list[Path]:
    """The sandbox cgroups this process made that are still there, in any hierarchy."""
    return list(Path("/sys/fs/cgroup").glob(f"*/**/{GROUP_PREFIX}{os.getpid()}-*"))


@functools.cache
def memory_bounded_in_total() -> bool:
    """Whether the sandbox can hold its processes' memory together here (a cgroup: the
    caller is root and the cgroup v1 memory and pids hierarchies are there)."""
    with tempfile.TemporaryDirectory() as scratch:
        outcome = python("pass", Path(scratch))
    assert outcome.ok, outcome
    return outcome.total_memory_bytes == TIGHT.memory_bytes


def test_a_good_command_runs_in_a_copy_of_its_directory(tmp_path: Path) -> None:
    (tmp_path / "data.txt").write_text("42")
    (tmp_path / "package").mkdir()
    (tmp_path / "package" / "module.py").write_text("VALUE = 7\n")
    (tmp_path / "link.txt").symlink_to("data.txt")
    code = (
        "import os\n"
        "from package.module import VALUE\n"
        "print(open('data.txt').read(), VALUE, os.readlink('link.txt'))\n"
        "open('data.txt', 'w').write('changed')\n"
        "open('new.txt', 'w').write('new')\n"
    )
    outcome = run([PYTHON, "-c", code], tmp_path, TIGHT)
    assert outcome.ok and outcome.stdout.split() == ["42", "7", "data.txt"], outcome
    assert outcome.stopped is None and outcome.isolated_network
    # What it wrote went with the sandbox: the caller's directory is as it was.
    assert (tmp_path / "data.txt").read_text() == "42"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["data.txt", "link.txt", "package"]


def test_a_directory_larger_than_the_disk_limit_is_not_run(tmp_path: Path) -> None:
    for number in range(4):
        (tmp_path / f"part-{number}").write_bytes(b"x" * (512 << 10))
    limits = dataclasses.replace(TIGHT, file_bytes=4 << 20, disk_bytes=1 << 20)
    outcome = python("print('ran')", tmp_path, limits)
    assert not outcome.ok and "ran" not in outcome.stdout
    assert "the task directory could not be copied" in outcome.stderr
    assert "No space left on device" in outcome.stderr


def test_without_a_cgroup_the_outcome_says_memory_is_bounded_per_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A caller that is not root makes no cgroup: only each process's address space is
    # bounded, and the outcome says what that allows all together.
    monkeypatch.setattr(sandbox, "_caller_is_root", lambda: False)
    outcome = python("pass", tmp_path)
    assert outcome.ok
    address_spaces = TIGHT.processes * TIGHT.memory_bytes
    assert outcome.total_memory_bytes == address_spaces + TIGHT.disk_bytes + TIGHT.file_bytes


def test_with_a_cgroup_memory_is_bounded_in_total_and_the_cgroup_goes(tmp_path: Path) -> None:
    if not memory_bounded_in_total():
        pytest.skip("no cgroup can be made here (not root, or no cgroup v1 memory and pids)")
    # Seen from the host while it runs (it waits on a pipe until the host has looked):
    # the command is in a cgroup of its own, with the run's limits; once the run is
    # over, the cgroup is gone.
    release, held = os.pipe()
    limits: dict[str, str] = {}

    def look() -> None:
        deadline = time.monotonic() + 15
        try:
            while len(limits) < 2 and time.monotonic() < deadline:
                for group in cgroups_left():
                    for name, limit in (("memory", "memory.limit_in_bytes"), ("pids", "pids.max")):
                        # Once the sandbox is in it: its limits were set before.
                        if (group / limit).exists() and (group / "cgroup.procs").read_text():
                            limits[name] = (group / limit).read_text().strip()
                time.sleep(0.05)
        finally:
            os.write(held, b"x")

    watcher = threading.Thread(target=look)
    watcher.start()
    try:
        outcome = python(f"import os; os.read({release}, 1)", tmp_path, pass_fds=(release,))
    finally:
        watcher.join()
        os.close(release)
        os.close(held)
    assert outcome.ok, outcome
    assert outcome.total_memory_bytes == TIGHT.memory_bytes
    # Its processes, counted in the cgroup whatever user they run as: the command's,
    # and bwrap's own few.
    processes = TIGHT.processes + sandbox._BWRAP_PROCESSES
    assert limits == {"memory": str(TIGHT.memory_bytes), "pids": str(processes)}
    assert cgroups_left() == []


def test_what_is_mounted_under_tmp_is_not_hidden_by_the_private_tmp(tmp_path: Path) -> None:
    # A checkout under /tmp puts the interpreter's virtual environment there: the
    # sandbox's own /tmp must not hide it (every task failed with "No such file").
    shared = tmp_path / "venv-like"
    shared.mkdir()
    (shared / "marker").write_text("seen")
    os.chmod(tmp_path, 0o755)
    task = tmp_path / "task"
    task.mkdir()
    code = "print(open('/tmp/checkout/venv-like/marker').read())"
    outcome = run([PYTHON, "-c", code], task, TIGHT, mounts={"/tmp/checkout/venv-like": shared})
    assert outcome.ok, outcome.stderr
    assert outcome.stdout.strip() == "seen"


def test_a_cgroup_left_by_a_killed_caller_is_removed(tmp_path: Path) -> None:
    if not memory_bounded_in_total():
        pytest.skip("no cgroup can be made here (not root, or no cgroup v1 memory and pids)")
    ended = subprocess.Popen(["true"])
    ended.wait()  # its pid is no process's now: the caller that made the cgroup is gone
    parent = sandbox._own_cgroup("memory")
    assert parent is not None
    stale = parent / f"{GROUP_PREFIX}{ended.pid}-0badc0de"
    stale.mkdir()
    try:
        assert python("pass", tmp_path).ok
        assert not stale.exists()
    finally:
        if stale.exists():
            stale.rmdir()


def test_a_command_that_never_ends_is_stopped_at_its_time_limit(tmp_path: Path) -> None:
    limits = Limits(wall_s=1.0, memory_bytes=512 << 20)
    outcome = run([PYTHON, "-c", "while True: pass"], tmp_path, limits)
    assert not outcome.ok and outcome.stopped == "timeout"


def test_a_fork_bomb_is_held_and_leaves_nothing_behind(tmp_path: Path) -> None:
    marker = f"forkbomb-{os.getpid()}"
    code = (
        "import os, time\n"
        "while True:\n"
        "    try:\n"
        "        os.fork()\n"
        "    except OSError:\n"
        "        time.sleep(0.01)\n"
    )
    (tmp_path / f"{marker}.py").write_text(code)
    outcome = run([PYTHON, f"{marker}.py"], tmp_path, Limits(wall_s=2.0, processes=16))
    assert outcome.stopped == "timeout"
    assert leftovers(marker) == ""  # its PID namespace went with it


def test_a_memory_hog_fails_with_memory_error(tmp_path: Path) -> None:
    outcome = python("x = bytearray(2 << 30)", tmp_path)
    assert not outcome.ok and "MemoryError" in outcome.stderr


def test_filling_the_disk_stops_at_the_file_size_limit(tmp_path: Path) -> None:
    code = (
        "import os\n"
        "f = open('big', 'wb', buffering=0)\n"
        "try:\n"
        "    while True: f.write(b'x' * 65536)\n"
        "finally:\n"
        "    print(os.fstat(f.fileno()).st_size)\n"
    )
    outcome = python(code, tmp_path)
    # Python ignores SIGXFSZ: the write fails (EFBIG) instead of the process dying.
    assert not outcome.ok and "File too large" in outcome.stderr
    assert 0 < int(outcome.stdout) <= TIGHT.file_bytes


def test_a_program_killed_for_its_file_size_says_so(tmp_path: Path) -> None:
    outcome = run(["sh", "-c", "head -c 4000000 /dev/zero > big"], tmp_path, TIGHT)
    assert outcome.stopped == "file_size"


def test_the_callers_secrets_are_not_in_its_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GATEWAY_TEST_SECRET", "sk-do-not-leak")
    outcome = python("import os; print(sorted(os.environ))", tmp_path)
    assert outcome.ok
    assert "GATEWAY_TEST_SECRET" not in outcome.stdout and "sk-do-not-leak" not in outcome.stdout


def test_a_caller_that_is_not_root_gets_one_bwrap_with_every_namespace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Run as root here, this takes the path of any other caller: no setpriv, the user
    # namespace made by the one bwrap.
    monkeypatch.setattr(sandbox, "_caller_is_root", lambda: False)
    code = (
        "import os, socket\n"
        "status = open('/proc/self/status').read()\n"
        "print(os.getuid(), os.getgid(), status.split('CapEff:')[1].split()[0])\n"
        "print(sorted(p for p in os.listdir('/proc') if p.isdigit()))\n"
        "print(os.path.exists('/etc/shadow'), socket.if_nameindex())\n"
    )
    outcome = python(code, tmp_path)
    assert outcome.ok, outcome
    ids, pids, view = outcome.stdout.splitlines()
    assert ids == f"{SANDBOX_UID} {SANDBOX_UID} 0000000000000000"
    assert len(ast.literal_eval(pids)) < 5  # its own processes only
    assert view == "False [(1, 'lo')]"


def test_without_bwrap_untrusted_code_is_refused_not_run_unsandboxed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sandbox, "_BWRAP", None)
    sandbox.unavailable.cache_clear()
    try:
        with pytest.raises(SandboxUnavailable, match="bubblewrap"):
            python("open('ran', 'w').write('unsandboxed')", tmp_path)
    finally:
        sandbox.unavailable.cache_clear()
    assert not (tmp_path / "ran").exists()


# The escapes. Each is Python run in the sandbox that prints "ESCAPED: ..." if it gets
# out, "held: ..." for each way it tried and was stopped, and "tried" once it has tried
# them all (so a crash before trying is not taken for a success of the sandbox), or is
# stopped with the reason it must be stopped for; some are also checked from the host
# afterwards. Each has a line to the host: a socket whose messages carry the sender's
# credentials as the host sees them, and which ends once no process holds it.

PRELUDE = '''
import os, socket, sys, time

def attempt(what, action):
    """`action` succeeding is an escape."""
    try:
        result = action()
    except BaseException as exc:
        print(f"held: {what}: {type(exc).__name__}: {exc}")
    else:
        print(f"ESCAPED: {what}: {result!r}"[:400])

def write(path):
    with open(path, "w") as file:
        file.write("pwned")
    return path

def connect(family, address):
    with socket.socket(family, socket.SOCK_STREAM) as client:
        client.settimeout(3)
        client.connect(address)
    return address
'''


@dataclass
class Host:
    """What the escapes aim at on the host, set up by the test."""

    task: Path  # the sandbox's directory
    outside: Path  # a directory of the host's, beside it
    unix_server: socket.socket
    abstract_name: str
    tcp_server: socket.socket
    marker: str  # in the command line of every process an escape starts
    line: socket.socket  # the host's end of the line
    line_inside: socket.socket  # the sandbox's end, handed over

    def heard(self) -> list[tuple[bytes, int]]:
        """Each message the sandbox sent on the line, with its sender's uid on the host,
        up to the line's end: once this returns, no process holds the sandbox's end."""
        self.line_inside.close()
        self.line.settimeout(10)  # a process still holding it and silent: an error
        heard: list[tuple[bytes, int]] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            size = socket.CMSG_SPACE(struct.calcsize("3i"))
            message, ancillary, _, _ = self.line.recvmsg(256, size)
            if not message:
                return heard
            uid = next(
                struct.unpack("3i", data)[1]
                for level, kind, data in ancillary
                if (level, kind) == (socket.SOL_SOCKET, socket.SCM_CREDENTIALS)
            )
            heard.append((message, uid))
        raise AssertionError(f"the line is still held after 30 s: {heard[-3:]}")

    @property
    def fields(self) -> dict[str, object]:
        return {
            "outside": str(self.outside),
            "unix_path": self.unix_server.getsockname(),
            "abstract": self.abstract_name,
            "tcp_port": self.tcp_server.getsockname()[1],
            "host_pid": os.getpid(),
            "tenants": str(TENANTS),
            "project": str(ROOT),
            "venv": sys.prefix,
            "marker": self.marker,
            "line": self.line_inside.fileno(),
            "file_bytes": TIGHT.file_bytes,
            "disk_bytes": TIGHT.disk_bytes,
        }

    def no_connection(self) -> None:
        """Neither listening socket saw a connection (one would wait in its backlog)."""
        for server in (self.unix_server, self.tcp_server):
            server.setblocking(False)
            with pytest.raises(BlockingIOError):
                server.accept()


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Host]:
    task, outside = tmp_path / "task", tmp_path / "outside"
    task.mkdir()
    outside.mkdir()
    monkeypatch.setenv("GATEWAY_EVAL_KEY", "sk-caller-secret")
    unix_server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix_server.bind(str(outside / "gateway.sock"))
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract_name = f"gateway-sandbox-test-{os.getpid()}"
    abstract.bind("\0" + abstract_name)
    tcp_server = socket.create_server(("127.0.0.1", 0))
    for server in (unix_server, abstract):
        server.listen()
    line, line_inside = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    # Each message then carries its sender's pid, uid and gid, as the host sees them.
    line.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    marker = f"escape-{os.getpid()}"
    try:
        yield Host(task, outside, unix_server, abstract_name, tcp_server, marker, line, line_inside)
    finally:
        for server in (unix_server, abstract, tcp_server, line, line_inside):
            server.close()


def _nothing_written_outside(host: Host, outcome: Outcome) -> None:
    assert list(host.outside.iterdir()) == [host.outside / "gateway.sock"]
    assert not (Path(sys.prefix) / "pwned").exists()


def _runs_as_nobody(host: Host, outcome: Outcome) -> None:
    # The kernel says who sent it: nobody on the host too when the caller is root, not
    # root; the caller when it is not.
    assert host.heard() == [(b"whoami", SANDBOX_UID if os.geteuid() == 0 else os.geteuid())]


def _nothing_outlives_the_run(host: Host, outcome: Outcome) -> None:
    # The daemon beat on the line every 0.05 s while it lived; the line ends, so no
    # process of the sandbox holds it any more.
    heard = [message for message, _ in host.heard()]
    assert heard[0] == b"daemon-started" and set(heard[1:]) <= {b"beat"}
    assert leftovers(host.marker) == ""


def _stopped_for_memory_and_gone(host: Host, outcome: Outcome) -> None:
    assert outcome.stopped == "memory" and not outcome.ok
    assert outcome.total_memory_bytes == TIGHT.memory_bytes
    # Stopped at the limit, not when it gave up (10 s, 15 s) or at the wall limit: the
    # program never got to the line after its attempt.
    assert "tried" not in outcome.stdout
    assert leftovers(host.marker) == ""
    assert cgroups_left() == []


def _refused_past_the_disk_limit(host: Host, outcome: Outcome) -> None:
    assert "No space left on device" in outcome.stdout
    written = int(outcome.stdout.split("written: ")[1].split()[0])
    assert 0 < written <= TIGHT.disk_bytes


def _no_connection(host: Host, outcome: Outcome) -> None:
    host.no_connection()


def _within_the_wall_limit(host: Host, outcome: Outcome) -> None:
    # The program exited by itself; the child holding its stdout did not hold the run
    # to the wall limit (that would be "timeout").
    assert outcome.stopped is None
    assert leftovers(host.marker) == ""


@dataclass(frozen=True)
class Escape:
    name: str
    code: str  # formatted with Host.fields
    check: Callable[[Host, Outcome], None] | None = None
    # Held by the sandbox's cgroup: where none can be made, not tried (the outcome then
    # says so: test_without_a_cgroup_the_outcome_says_memory_is_bounded_per_process).
    needs_cgroup: bool = False
    # The reason it must be stopped for, when it is stopped rather than refused.
    stopped: str | None = None


ESCAPES = [
    Escape("read /etc/shadow", 'attempt("/etc/shadow", lambda: open("/etc/shadow").read())'),
    Escape(
        "read the project's tenants file and code",
        """
attempt("tenants file", lambda: open({tenants!r}).read())
attempt("the gateway's code", lambda: open({project!r} + "/gateway_tools/eval/judge.py").read())
attempt("the gateway package", lambda: __import__("gateway_tools.eval.judge"))
def checkout():
    names = sorted(set(os.listdir({project!r})) - {{os.path.basename({venv!r})}})
    if names:
        return names
    raise LookupError("only the virtual environment's mount point is there")
attempt("the checkout around the venv", checkout)
""",
    ),
    Escape(
        "read the caller's GATEWAY_EVAL_KEY through /proc",
        """
def environs():
    seen = [p for p in os.listdir("/proc") if p.isdigit()]
    assert len(seen) < 10, seen  # only its own few processes are there
    found = []
    for pid in [*seen, str(os.getppid()), "1", str({host_pid})]:
        try:
            if b"GATEWAY_EVAL_KEY" in open(f"/proc/{{pid}}/environ", "rb").read():
                found.append(pid)
        except OSError:
            pass
    if "GATEWAY_EVAL_KEY" in os.environ:
        found.append("own environment")
    if found:
        return found
    raise LookupError("not in any environment it can read")
attempt("GATEWAY_EVAL_KEY", environs)
attempt("the caller's /proc", lambda: open("/proc/{host_pid}/environ", "rb").read())
""",
    ),
    Escape(
        "write outside the task directory",
        """
for target in [{outside!r} + "/pwned", {venv!r} + "/pwned", "/usr/pwned", "/pwned",
               "/proc/sys/kernel/hostname", "/etc/pwned"]:
    attempt(f"write {{target}}", lambda: write(target))
""",
        _nothing_written_outside,
    ),
    Escape(
        "connect to a host Unix socket",
        """
attempt("socket file", lambda: connect(socket.AF_UNIX, {unix_path!r}))
attempt("abstract socket", lambda: connect(socket.AF_UNIX, "\\0" + {abstract!r}))
""",
        _no_connection,
    ),
    Escape(
        "reach 127.0.0.1 on a port the host listens on",
        'attempt("tcp", lambda: connect(socket.AF_INET, ("127.0.0.1", {tcp_port})))',
        _no_connection,
    ),
    Escape(
        "run as root",
        """
os.write({line}, b"whoami")
def root():
    ids = (os.getuid(), os.geteuid(), os.getgid(), os.getegid())
    caps = [l for l in open("/proc/self/status") if l.startswith("CapEff")][0].split()[1]
    if 0 in ids or int(caps, 16):
        return ids, caps
    raise PermissionError(f"ids {{ids}}, effective capabilities {{caps}}")
attempt("root ids or capabilities", root)
attempt("setuid(0)", lambda: os.setuid(0))
def new_user_namespace():
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x10000000) != 0:  # CLONE_NEWUSER
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return "unshared"
attempt("a new user namespace", new_user_namespace)
""",
        _runs_as_nobody,
    ),
    Escape(
        "leave the process limit and outlive the run",
        """
# {marker}
attempt("the root cgroup", lambda: write("/sys/fs/cgroup/cgroup.procs"))
attempt("the pids cgroup", lambda: write("/sys/fs/cgroup/pids/cgroup.procs"))
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.write({line}, b"daemon-started")
        for beat in range(100000):
            os.write({line}, b"beat")
            time.sleep(0.05)
    os._exit(0)
time.sleep(0.5)
""",
        _nothing_outlives_the_run,
    ),
    Escape(
        "hold stdout open to stretch the wall limit",
        """
# {marker}
import subprocess
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)  # {marker}"],
                 start_new_session=True)
print("held: the child keeps stdout; the program exits")
""",
        _within_the_wall_limit,
    ),
    Escape(
        # Each process within its own address space: 1.8 GB together, under 512 MB.
        "hold more memory than the limit in many processes",
        """
# {marker}
def hog():
    children = []
    for _ in range(6):
        pid = os.fork()
        if pid == 0:
            data = b"x" * (300 << 20)  # written: resident, not only reserved
            time.sleep(10)
            os._exit(0)
        children.append(pid)
    statuses = [os.waitpid(pid, 0)[1] for pid in children]
    if all(status == 0 for status in statuses):
        return "6 x 300 MB held at once"
    raise MemoryError(f"children ended with {{statuses}}")
attempt("6 x 300 MB in 6 processes", hog)
""",
        _stopped_for_memory_and_gone,
        needs_cgroup=True,
        stopped="memory",
    ),
    Escape(
        # Empty files: nothing a tmpfs's size counts, but each an inode and a dentry of
        # the kernel's memory.
        "fill the kernel's memory with empty files",
        """
# {marker}
def files():
    start, made = time.monotonic(), 0
    while time.monotonic() - start < 15:
        for _ in range(1000):
            name = f"{{made:09d}}-" + "x" * 200
            os.close(os.open(name, os.O_CREAT | os.O_WRONLY, 0o600))
            made += 1
    return f"{{made}} files"
attempt("empty files for 15 s", files)
""",
        _stopped_for_memory_and_gone,
        needs_cgroup=True,
        stopped="memory",
    ),
    Escape(
        # Each file within the file size limit: far more than the disk limit together.
        "fill the disk with many files each under the file size limit",
        """
written = 0
def fill():
    global written
    for number in range(4 * {disk_bytes} // {file_bytes}):
        with open(f"filler-{{number}}", "wb") as file:
            file.write(b"x" * {file_bytes})
        written += {file_bytes}
    return f"{{written}} bytes in /task"
attempt("files past the disk limit", fill)
print(f"written: {{written}}")
""",
        _refused_past_the_disk_limit,
    ),
]


@pytest.mark.parametrize("escape", ESCAPES, ids=[e.name for e in ESCAPES])
def test_an_escape_fails(host: Host, escape: Escape) -> None:
    if escape.needs_cgroup and not memory_bounded_in_total():
        pytest.skip("no cgroup can be made here (not root, or no cgroup v1 memory and pids)")
    code = PRELUDE + textwrap.dedent(escape.code).format(**host.fields) + '\nprint("tried")\n'
    outcome = python(code, host.task, pass_fds=(host.line_inside.fileno(),))
    output = outcome.stdout + outcome.stderr
    assert "ESCAPED" not in output, output
    if escape.stopped is None:
        assert "held:" in outcome.stdout and "tried" in outcome.stdout, output
    else:
        assert outcome.stopped == escape.stopped, outcome
    if escape.check is not None:
        escape.check(host, outcome)
    # Whatever it wrote, it wrote in its own copy: the caller's directory is untouched.
    assert list(host.task.iterdir()) == []


def test_a_program_that_never_ends_while_a_child_holds_stdout_is_killed_at_the_limit(
    tmp_path: Path,
) -> None:
    marker = f"holder-{os.getpid()}"
    code = (
        f"import subprocess, sys  # {marker}\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)  # {marker}'],"
        " start_new_session=True)\n"
        "while True: pass\n"
    )
    outcomes: list[Outcome] = []
    run = threading.Thread(
        target=lambda: outcomes.append(python(code, tmp_path, Limits(wall_s=2.0))), daemon=True
    )
    run.start()
    run.join(120)  # a hang guard: had the run waited for the child, 600 s
    assert outcomes, "the run waited for the child that holds its stdout"
    assert outcomes[0].stopped == "timeout"
    # Killed with the run, not waited for: it would have slept on for minutes.
    assert leftovers(marker) == ""


# Forging the verdict: a wrong answer (`add` multiplies) that tries to be judged a pass.
WRONG = "def add(a, b):\n    return a * b\n"
FAKE_REPORT = (
    '<?xml version="1.0"?><testsuites><testsuite tests="2">'
    '<testcase classname="_hidden_tests.test_ops" name="test_add"/>'
    '<testcase classname="_hidden_tests.test_ops" name="test_zero"/>'
    "</testsuite></testsuites>"
)
FORGERIES = {
    # The report pytest used to write, faked where the judge read it (beside the task
    # directory) and in it, then an exit before pytest could write the real one.
    "fake report, then exit 0": {
        "calc/ops.py": WRONG
        + "import os\n"
        + "for path in ('../pytest-report.xml', 'pytest-report.xml', '../results.jsonl'):\n"
        + "    try:\n"
        + f"        open(path, 'w').write({FAKE_REPORT!r})\n"
        + "    except OSError:\n"
        + "        pass\n"
        + "os._exit(0)\n"
    },
    # A daemon that rewrites the report once pytest is done.
    "daemon rewriting the report after the run": {
        "calc/ops.py": WRONG
        + "import os, time\n"
        + "if os.fork() == 0:\n"
        + "    os.setsid()\n"
        + "    time.sleep(1.5)\n"
        + "    for path in ('../pytest-report.xml', 'pytest-report.xml'):\n"
        + "        try:\n"
        + f"            open(path, 'w').write({FAKE_REPORT!r})\n"
        + "        except OSError:\n"
        + "            pass\n"
        + "    os._exit(0)\n"
    },
    # The hidden tests rewritten when the answer is imported, before they are collected.
    "hidden tests rewritten": {
        "calc/ops.py": WRONG
        + "try:\n"
        + "    open('_hidden_tests/test_ops.py', 'w').write('def test_add():\\n    pass\\n')\n"
        + "except OSError:\n"
        + "    pass\n"
    },
    # The tests it would fail skipped, those it passes passed.
    "skip what fails": {
        "calc/ops.py": "def add(a, b):\n"
        + "    if (a, b) != (0, 0):\n"
        + "        import pytest\n"
        + "        pytest.skip('not today')\n"
        + "    return 0\n"
    },
    # pytest (and Python's start-up hooks) replaced by the answer's own.
    "impostor pytest and start-up hooks": {
        "calc/ops.py": WRONG,
        "pytest.py": "print('2 passed in 0.01s')\nraise SystemExit(0)\n",
        "sitecustomize.py": "import os\nos._exit(0)\n",
        "usercustomize.py": "import os\nos._exit(0)\n",
        "evil.pth": "import os; os._exit(0)\n",
    },
}


@pytest.mark.parametrize("files", FORGERIES.values(), ids=list(FORGERIES))
def test_a_forged_verdict_fails(tmp_path: Path, files: dict[str, str]) -> None:
    task = load_task(write_task(tmp_path))
    answer = "".join(f"FILE: {path}\n```\n{text}```\n\n" for path, text in files.items())
    attempt = Attempt(candidate="m", task=task.id, attempt=0, category=task.category, passed=False)
    judge_answer(attempt, task, answer, dataclasses.replace(TIGHT, wall_s=8.0))
    assert attempt.passed is False, attempt
    assert attempt.reason is not None
    assert attempt.reason.startswith(("tests failed:", "tests did not run:")), attempt.reason
