"""The sandbox holds its limits against code that misbehaves: it loops, forks without end,
eats memory, fills the disk, reads the caller's secrets, or reaches for the network.
Each is a real subprocess; each ends in an `Outcome` that says what happened."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.eval.sandbox import PIDS_ROOT, Limits, network_isolation_available, run

PYTHON = sys.executable
# Tight enough that each test ends quickly; a wall limit far above what a good command
# takes, so that only a command that misbehaves reaches it.
TIGHT = Limits(wall_s=20, memory_bytes=512 << 20, processes=32, file_bytes=1 << 20)


def python(code: str, directory: Path, limits: Limits = TIGHT) -> object:
    return run([PYTHON, "-c", code], directory, limits)


def test_a_good_command_runs_in_its_directory(tmp_path: Path) -> None:
    (tmp_path / "data.txt").write_text("42")
    outcome = run([PYTHON, "-c", "print(open('data.txt').read())"], tmp_path, TIGHT)
    assert outcome.ok and outcome.stdout.strip() == "42"
    assert outcome.stopped is None


def test_a_command_that_never_ends_is_stopped_at_its_time_limit(tmp_path: Path) -> None:
    limits = Limits(wall_s=1.0, memory_bytes=512 << 20)
    outcome = run([PYTHON, "-c", "while True: pass"], tmp_path, limits)
    assert not outcome.ok and outcome.stopped == "timeout"


def test_a_fork_bomb_is_held_and_leaves_nothing_behind(tmp_path: Path) -> None:
    marker = f"forkbomb-{os.getpid()}"
    code = (
        "import os, sys, time\n"
        f"sys.argv[0] = {marker!r}\n"
        "while True:\n"
        "    try:\n"
        "        os.fork()\n"
        "    except OSError:\n"
        "        time.sleep(0.01)\n"
    )
    script = tmp_path / f"{marker}.py"
    script.write_text(code)
    outcome = run([PYTHON, script.name], tmp_path, Limits(wall_s=2.0, processes=16))
    assert outcome.stopped == "timeout"
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
    assert left == ""  # the whole process group was killed
    if PIDS_ROOT.is_dir():  # held at the limit, even as root, and the cgroup is gone
        assert not list(PIDS_ROOT.glob(f"gateway-sandbox-{os.getpid()}-*"))


def test_a_memory_hog_fails_with_memory_error(tmp_path: Path) -> None:
    outcome = python("x = bytearray(2 << 30)", tmp_path)
    assert not outcome.ok and "MemoryError" in outcome.stderr


def test_filling_the_disk_stops_at_the_file_size_limit(tmp_path: Path) -> None:
    code = "f = open('big', 'wb')\nwhile True: f.write(b'x' * 65536)"
    outcome = python(code, tmp_path)
    # Python ignores SIGXFSZ: the write fails (EFBIG) instead of the process dying.
    assert not outcome.ok and "File too large" in outcome.stderr
    assert (tmp_path / "big").stat().st_size <= TIGHT.file_bytes


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


def test_no_network_where_the_machine_allows_it(tmp_path: Path) -> None:
    code = (
        "import socket\n"
        "try:\n"
        "    socket.create_connection(('127.0.0.1', 6379), timeout=2)\n"
        "    print('connected')\n"
        "except OSError as exc:\n"
        "    print('refused', exc)\n"
    )
    outcome = python(code, tmp_path)
    assert outcome.isolated_network == network_isolation_available()
    if outcome.isolated_network:
        assert outcome.stdout.startswith("refused")  # Redis runs on 6379 outside
