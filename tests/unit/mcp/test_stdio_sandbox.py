"""A stdio server's command in bubblewrap (gateway/mcp/stdio_sandbox.py): the argv it is
run with (namespaces, no network unless configured, a cleared environment handed over a
descriptor so that no secret is on a command line, only the configured paths, a second
bwrap under `setpriv` when the gateway is root, prlimit's bounds), refused outright
without bwrap; and two real runs: uid 65534 inside, and no host /etc to read."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.config.schema import McpSandbox, McpServer
from gateway.mcp.stdio_sandbox import (
    SANDBOX_UID,
    SandboxUnavailable,
    for_tenant,
    sandboxed,
    tenant_dir_name,
)

TOOLS = {"bwrap": "/opt/bin/bwrap", "prlimit": "/opt/bin/prlimit", "setpriv": "/opt/bin/setpriv"}
COMMAND = ["node", "/opt/mcp/server-filesystem/dist/index.js", "/srv/shared"]
SECRET = "sk-live-0123456789abcdef"


def installed(*present: str) -> Callable[[str], str | None]:
    def which(name: str) -> str | None:
        return TOOLS[name] if name in present else None

    return which


@pytest.fixture
def user(monkeypatch: pytest.MonkeyPatch) -> None:
    """A gateway run by an ordinary user, with bwrap, prlimit and setpriv installed."""
    monkeypatch.setattr(shutil, "which", installed(*TOOLS))
    monkeypatch.setattr(os, "geteuid", lambda: 1000)


@pytest.fixture
def root(monkeypatch: pytest.MonkeyPatch) -> None:
    """A gateway run as root, with bwrap, prlimit and setpriv installed."""
    monkeypatch.setattr(shutil, "which", installed(*TOOLS))
    monkeypatch.setattr(os, "geteuid", lambda: 0)


def build(
    sandbox: McpSandbox, env: dict[str, str] | None = None, command: list[str] = COMMAND
) -> tuple[list[str], list[str], int]:
    """The argv, the arguments its descriptor holds, and the descriptor's number."""
    made = sandboxed(command, sandbox, env or {})
    try:
        held = os.pread(made.env_fd, 1 << 20, 0)
    finally:
        os.close(made.env_fd)
    assert held.endswith(b"\0")
    return made.argv, [part.decode() for part in held[:-1].split(b"\0")], made.env_fd


def after(argv: list[str], flag: str, count: int = 1) -> list[list[str]]:
    """The `count` arguments that follow each `flag` in `argv`."""
    return [argv[i + 1 : i + 1 + count] for i, arg in enumerate(argv) if arg == flag]


def setenv(arguments: list[str]) -> dict[str, str]:
    assert len(arguments) % 3 == 0
    triples = [arguments[i : i + 3] for i in range(0, len(arguments), 3)]
    assert all(flag == "--setenv" for flag, _, _ in triples)
    return {name: value for _, name, value in triples}


def test_the_command_runs_last_under_prlimit_in_bwrap(user: None) -> None:
    argv, _, _ = build(McpSandbox())
    assert argv[0] == TOOLS["bwrap"]
    assert argv[-len(COMMAND) :] == COMMAND
    end = len(argv) - len(COMMAND)
    assert argv[end - 1] == "--"
    start = argv.index(TOOLS["prlimit"])
    assert argv[start - 1] == "--"
    assert argv[start + 1 : end - 1] == ["--nofile=1024", "--nproc=1024", "--core=0"]


def test_every_namespace_and_no_network_by_default(user: None) -> None:
    argv, _, _ = build(McpSandbox())
    for flag in ("--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts"):
        assert flag in argv
    assert "--unshare-user" in argv and "--disable-userns" in argv
    assert after(argv, "--uid") == [[str(SANDBOX_UID)]]
    assert after(argv, "--gid") == [[str(SANDBOX_UID)]]
    assert "--die-with-parent" in argv
    # No /etc of the host: not its passwd, not its resolver.
    assert not [arg for arg in argv if arg.startswith("/etc")]


def test_a_server_with_the_network_keeps_it_and_gets_the_resolver_read_only(user: None) -> None:
    argv, _, _ = build(McpSandbox(network=True))
    assert "--unshare-net" not in argv
    etc = [arg for arg in argv if arg.startswith("/etc/")]
    assert etc, "resolv.conf, hosts or the certificates"
    bound = [pair[0] for pair in after(argv, "--ro-bind")]
    assert all(path in bound for path in etc)
    assert not [pair for pair in after(argv, "--bind") if pair[0].startswith("/etc")]


def test_the_environment_is_cleared_and_handed_over_the_descriptor(user: None) -> None:
    env = {"API_TOKEN": SECRET, "LOG_LEVEL": "info"}
    argv, arguments, env_fd = build(McpSandbox(), env)
    assert "--clearenv" in argv
    assert after(argv, "--args") == [[str(env_fd)]]
    assert argv.index("--clearenv") < argv.index("--args")
    assert setenv(arguments) == {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": "/tmp",
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "API_TOKEN": SECRET,
        "LOG_LEVEL": "info",
    }
    assert not [arg for arg in argv if SECRET in arg or "API_TOKEN" in arg]
    assert "--setenv" not in argv


def test_a_server_s_env_may_replace_the_defaults(user: None) -> None:
    _, arguments, _ = build(McpSandbox(), {"HOME": "/srv/home", "LANG": "de_DE.UTF-8"})
    held = setenv(arguments)
    assert (held["HOME"], held["LANG"]) == ("/srv/home", "de_DE.UTF-8")


def test_only_the_configured_paths_are_bound_read_only_or_writable(user: None) -> None:
    sandbox = McpSandbox(read_only=["/opt/mcp/server-filesystem"], writable=["/srv/shared"])
    argv, _, _ = build(sandbox)
    assert ["/opt/mcp/server-filesystem", "/opt/mcp/server-filesystem"] in after(
        argv, "--ro-bind", 2
    )
    assert after(argv, "--bind", 2) == [["/srv/shared", "/srv/shared"]]
    assert ["/usr", "/usr"] in after(argv, "--ro-bind", 2)
    assert [p for p, _ in after(argv, "--ro-bind", 2) if p.startswith("/srv")] == []


def test_the_parents_of_configured_paths_are_made_readable(user: None) -> None:
    sandbox = McpSandbox(read_only=["/opt/mcp/server-filesystem"], writable=["/srv/shared"])
    argv, _, _ = build(sandbox)
    assert [pair[0] for pair in after(argv, "--dir")] == ["/opt", "/opt/mcp", "/srv"]
    for i, arg in enumerate(argv):
        if arg == "--dir":
            assert argv[i - 2 : i] == ["--perms", "0755"]
    # Each parent is made before the path under it is bound.
    assert argv.index("/opt/mcp") < argv.index("/opt/mcp/server-filesystem")


def test_a_parent_shared_by_two_paths_is_made_once(user: None) -> None:
    argv, _, _ = build(McpSandbox(read_only=["/opt/a/one", "/opt/a/two"]))
    assert [pair[0] for pair in after(argv, "--dir")] == ["/opt", "/opt/a"]


def test_a_private_tmp_and_a_working_directory(user: None) -> None:
    made = sandboxed(COMMAND, McpSandbox(), {}, cwd="/srv/shared")
    os.close(made.env_fd)
    # /tmp, and /dev/shm (bwrap's /dev is a tmpfs its user may write there) bounded too.
    assert after(made.argv, "--tmpfs") == [["/tmp"], ["/dev/shm"]]
    assert after(made.argv, "--chdir") == [["/srv/shared"]]


def test_as_root_setpriv_drops_to_nobody_before_a_second_bwrap(root: None) -> None:
    argv, _, _ = build(McpSandbox())
    assert argv[0] == TOOLS["bwrap"]
    assert argv.count(TOOLS["bwrap"]) == 2
    drop = argv.index(TOOLS["setpriv"])
    inner = argv.index(TOOLS["bwrap"], 1)
    assert argv[drop - 1] == "--"
    assert drop < inner < argv.index(TOOLS["prlimit"])
    privileges = argv[drop + 1 : inner]
    for flag in ("--reuid=65534", "--regid=65534", "--clear-groups", "--no-new-privs"):
        assert flag in privileges
    # The outer bwrap makes no user namespace; the inner one does, as nobody.
    assert "--unshare-user" not in argv[:drop]
    assert "--unshare-user" in argv[inner:]
    assert after(argv[inner:], "--uid") == [["65534"]]
    assert "--unshare-net" in argv[:drop]
    assert argv[-len(COMMAND) :] == COMMAND


def test_as_an_ordinary_user_there_is_one_bwrap_and_no_setpriv(user: None) -> None:
    argv, _, _ = build(McpSandbox())
    assert argv.count(TOOLS["bwrap"]) == 1
    assert TOOLS["setpriv"] not in argv


def test_prlimit_bounds_files_and_processes_and_address_space_only_when_set(user: None) -> None:
    argv, _, _ = build(McpSandbox(open_files=64, processes=32))
    limits = argv[argv.index(TOOLS["prlimit"]) + 1 :]
    assert "--nofile=64" in limits and "--nproc=32" in limits
    assert not [arg for arg in argv if arg.startswith("--as")]
    argv, _, _ = build(McpSandbox(address_space_bytes=2 * 1024**3))
    limits = argv[argv.index(TOOLS["prlimit"]) + 1 :]
    assert "--as=2147483648" in limits


@pytest.mark.parametrize(
    ("present", "euid"),
    [
        (("prlimit", "setpriv"), 1000),
        (("bwrap", "setpriv"), 1000),
        ((), 1000),
        (("bwrap", "prlimit"), 0),  # root needs setpriv to drop to nobody
    ],
)
def test_without_bwrap_or_what_it_is_used_with_the_server_is_not_run(
    present: tuple[str, ...], euid: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shutil, "which", installed(*present))
    monkeypatch.setattr(os, "geteuid", lambda: euid)
    with pytest.raises(SandboxUnavailable, match="bubblewrap"):
        sandboxed(COMMAND, McpSandbox(), {})


def test_as_an_ordinary_user_without_setpriv_the_server_still_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(shutil, "which", installed("bwrap", "prlimit"))
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    argv, _, _ = build(McpSandbox())
    assert argv[0] == TOOLS["bwrap"]


# --- real runs ---------------------------------------------------------------------------


def run(command: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    made = sandboxed(command, McpSandbox(), env or {})
    try:
        return subprocess.run(
            made.argv, pass_fds=(made.env_fd,), capture_output=True, text=True, timeout=60
        )
    finally:
        os.close(made.env_fd)


def test_a_server_runs_as_uid_65534() -> None:
    done = run(["/usr/bin/id", "-u"])
    assert (done.returncode, done.stdout) == (0, f"{SANDBOX_UID}\n"), done.stderr


def test_a_server_cannot_read_the_host_s_etc() -> None:
    assert os.path.exists("/etc/hostname")
    done = run(["/usr/bin/cat", "/etc/hostname"])
    assert done.returncode != 0
    assert done.stdout == ""
    assert "No such file or directory" in done.stderr


def test_a_server_sees_its_own_environment_and_not_the_gateway_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GATEWAY_TEST_SECRET", "sk-do-not-leak")
    done = run(["/usr/bin/env"], {"API_TOKEN": SECRET})
    assert done.returncode == 0, done.stderr
    seen = dict(line.split("=", 1) for line in done.stdout.splitlines())
    assert seen["API_TOKEN"] == SECRET
    assert seen["HOME"] == "/tmp"
    assert "GATEWAY_TEST_SECRET" not in seen
    assert "sk-do-not-leak" not in done.stdout


@pytest.mark.parametrize("tenant", ["../etc", "a/b", "..", ".", "", "ten ant", "x" * 200, "é"])
def test_a_tenant_s_name_is_one_safe_path_segment(tenant: str) -> None:
    segment = tenant_dir_name(tenant)
    assert "/" not in segment and segment not in ("", ".", "..") and len(segment) <= 64
    assert not segment.startswith(".")


def test_names_alike_after_cleaning_stay_apart() -> None:
    assert tenant_dir_name("acme") == "acme"
    assert tenant_dir_name("a/b") != tenant_dir_name("a_b") != tenant_dir_name("a b")


def test_each_tenant_gets_its_own_writable_directory(tmp_path: Path) -> None:
    shared = f"{tmp_path}/notes/{{tenant}}"
    server = McpServer(
        command=["node", "server.js", shared],
        env={"NOTES": shared},
        sandbox=McpSandbox(read_only=["/opt/x"], writable=[shared]),
    )
    mine = for_tenant(server, "acme")
    assert mine.command == ["node", "server.js", f"{tmp_path}/notes/acme"]
    assert mine.env == {"NOTES": f"{tmp_path}/notes/acme"}
    assert mine.sandbox.writable == [f"{tmp_path}/notes/acme"]
    assert (tmp_path / "notes" / "acme").is_dir()
    assert not (tmp_path / "notes" / "{tenant}").exists()
