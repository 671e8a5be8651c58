"""A stdio MCP server's command, confined by bubblewrap.

The confinement of `gateway eval`'s sandbox (gateway_tools/eval/sandbox.py), for a
long-running server rather than a run with an end: new mount, PID, IPC, UTS, cgroup and
user namespaces, and a network namespace of its own unless the server is configured
with the network; `/usr` and the system's links read-only; a private `/tmp`; only the
paths configured for it besides (`sandbox.read_only`, `sandbox.writable`); an
environment of its own (`--clearenv`, its variables handed to bwrap through a
descriptor, so that no secret is on a command line); uid 65534 inside, and outside too
when the gateway runs as root (`setpriv` drops to it between two bwraps, as the eval's
sandbox does); `prlimit` bounds its processes, open files and, where configured, each
process's address space. It dies with the gateway (`--die-with-parent`), and killing its
first process ends every process it started (its PID namespace). The pieces both
sandboxes build alike (`system_mounts`, `parent_dirs`, `arguments_fd`) are here, and the
eval's uses them.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from gateway.config.schema import McpSandbox, McpServer

SANDBOX_UID = SANDBOX_GID = 65534
TMP_DIR = "/tmp"
# Mounted from the host read-only when they are directories; kept as the same symlinks
# when they are symlinks (a merged /usr).
SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# The size of its private /tmp.
TMP_BYTES = 64 * 1024 * 1024
INSTALL = "install bubblewrap and util-linux (apt-get install bubblewrap util-linux)"


class SandboxUnavailable(RuntimeError):
    """bwrap (or what it is used with) is not installed: no stdio server is run unconfined."""


@dataclass(frozen=True, slots=True)
class SandboxedCommand:
    """The argv to run, and the descriptor of its environment (`--args`), which the
    caller passes to the process and closes after."""

    argv: list[str]
    env_fd: int


def system_mounts() -> list[str]:
    """bwrap arguments for the system's programs and libraries, read-only."""
    argv = ["--ro-bind", "/usr", "/usr"]
    for path in SYSTEM_LINKS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    return argv


def parent_dirs(path: str, made: set[str], mode: str = "0755") -> list[str]:
    """`--dir` for each missing parent of `path`, readable by the sandbox's user (bwrap
    makes them 0700 otherwise, owned by root inside)."""
    argv: list[str] = []
    for parent in reversed(PurePosixPath(path).parents):
        if str(parent) not in made:
            made.add(str(parent))
            argv += ["--perms", mode, "--dir", str(parent)]
    return argv


def arguments_fd(env: Mapping[str, str]) -> int:
    """A descriptor of `--setenv NAME VALUE` for each of `env`, NUL-separated, that bwrap
    reads with `--args`: so the environment (a credential) is on no command line, which
    any user of the host may read (`ps`)."""
    descriptor = os.memfd_create("sandbox-env")
    arguments = [arg for name, value in env.items() for arg in ("--setenv", name, value)]
    with open(os.dup(descriptor), "wb") as file:
        file.write(b"".join(arg.encode() + b"\0" for arg in arguments))
    os.lseek(descriptor, 0, os.SEEK_SET)
    return descriptor


def sandboxed(
    command: Sequence[str], sandbox: McpSandbox, env: Mapping[str, str], cwd: str | None = None
) -> SandboxedCommand:
    """`command` to run in the sandbox `sandbox` describes, with `env` as its whole
    environment (beside PATH, HOME and the like); `SandboxUnavailable` without bwrap."""
    bwrap, prlimit = shutil.which("bwrap"), shutil.which("prlimit")
    root = os.geteuid() == 0
    setpriv = shutil.which("setpriv")
    if bwrap is None or prlimit is None or (root and setpriv is None):
        raise SandboxUnavailable(f"bwrap, prlimit or setpriv not found: {INSTALL}")
    environment = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": TMP_DIR,
        "TMPDIR": TMP_DIR,
        "LANG": "C.UTF-8",
        **env,
    }
    env_fd = arguments_fd(environment)
    argv = [bwrap, "--die-with-parent", "--new-session"]
    argv += ["--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try"]
    if not sandbox.network:
        argv.append("--unshare-net")
    if root:
        # The user namespace comes after the drop to nobody (the second bwrap), so that
        # nobody inside is nobody outside; this one keeps only what `setpriv` needs.
        argv += ["--cap-drop", "ALL"]
        argv += [a for cap in ("SETUID", "SETGID", "SETPCAP") for a in ("--cap-add", f"CAP_{cap}")]
    else:
        argv += ["--unshare-user", "--disable-userns", "--uid", str(SANDBOX_UID)]
        argv += ["--gid", str(SANDBOX_GID), "--cap-drop", "ALL"]
    argv += ["--clearenv", "--args", str(env_fd)]
    argv += system_mounts()
    argv += ["--perms", "1777", "--size", str(TMP_BYTES), "--tmpfs", TMP_DIR]
    made = {"/", "/usr", TMP_DIR}
    if sandbox.network:
        # Names to resolve, certificates to trust: the system's own, read-only.
        for path in ("/etc/resolv.conf", "/etc/hosts", "/etc/ssl", "/etc/ca-certificates"):
            if os.path.exists(path):
                argv += [*parent_dirs(path, made), "--ro-bind", path, path]
    for path in sandbox.read_only:
        argv += [*parent_dirs(path, made), "--ro-bind", path, path]
    for path in sandbox.writable:
        argv += [*parent_dirs(path, made), "--bind", path, path]
    # /dev is a tmpfs of bwrap's, its /dev/shm writable by all: bounded as /tmp is.
    shm = ["--perms", "1777", "--size", str(TMP_BYTES), "--tmpfs", "/dev/shm"]
    argv += ["--proc", "/proc", "--dev", "/dev", *shm]
    if cwd is not None:
        argv += ["--chdir", cwd]
    if root:
        assert setpriv is not None
        uid, gid = str(SANDBOX_UID), str(SANDBOX_GID)
        argv += [
            "--", setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--",
            bwrap, "--unshare-user", "--disable-userns", "--uid", uid, "--gid", gid,
            "--cap-drop", "ALL", "--die-with-parent", "--bind", "/", "/", "--dev", "/dev",
            *shm, "--proc", "/proc",
        ]  # fmt: skip
        if cwd is not None:
            argv += ["--chdir", cwd]
    limits = [f"--nofile={sandbox.open_files}", f"--nproc={sandbox.processes}", "--core=0"]
    if sandbox.address_space_bytes is not None:
        limits.append(f"--as={sandbox.address_space_bytes}")
    argv += ["--", prlimit, *limits, "--", *command]
    return SandboxedCommand(argv, env_fd)


# Where a stdio server's settings say `{tenant}`, each tenant's process gets its own.
TENANT = "{tenant}"
_SAFE = re.compile(r"[A-Za-z0-9_-]{1,64}")


def tenant_dir_name(tenant: str) -> str:
    """`tenant` as one path segment: itself when it is letters, digits, `_` and `-`
    (at most 64), else those kept and a hash of the whole (no `/`, no `..`)."""
    if _SAFE.fullmatch(tenant):
        return tenant
    kept = re.sub(r"[^A-Za-z0-9_-]", "_", tenant)[:48]
    return f"{kept}-{hashlib.sha256(tenant.encode()).hexdigest()[:12]}"


def for_tenant(server: McpServer, tenant: str) -> McpServer:
    """`server` as `tenant`'s process runs it: `{tenant}` in its command, `cwd`, `env`
    and sandbox paths replaced by the tenant's own segment, and each writable path of
    it made (the sandbox's user may write it), so that one tenant's files are no other's."""
    name = tenant_dir_name(tenant)

    def own(text: str) -> str:
        return text.replace(TENANT, name)

    sandbox = server.sandbox.model_copy(
        update={
            "read_only": [own(p) for p in server.sandbox.read_only],
            "writable": [own(p) for p in server.sandbox.writable],
        }
    )
    for original, path in zip(server.sandbox.writable, sandbox.writable, strict=True):
        if TENANT in original and not os.path.isdir(path):
            os.makedirs(path, mode=0o700, exist_ok=True)
            if os.geteuid() == 0:
                os.chown(path, SANDBOX_UID, SANDBOX_GID)
    return server.model_copy(
        update={
            "command": None if server.command is None else [own(a) for a in server.command],
            "cwd": None if server.cwd is None else own(server.cwd),
            "env": {key: own(value) for key, value in server.env.items()},
            "sandbox": sandbox,
        }
    )
