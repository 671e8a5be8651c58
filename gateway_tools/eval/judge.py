"""Judge a solution: a fresh copy of the task's snapshot, the hidden tests run on it in
the sandbox, and which tests passed.

The hidden tests are copied in after the answer is applied, into `_hidden_tests/`,
mounted read-only in the sandbox, and run by the real pytest, which nothing the answer
writes can replace or configure: `python -P -s` (neither the project nor a user
directory is on `sys.path` at start-up, so a `pytest.py`, `sitecustomize.py` or `.pth`
of the answer's is never loaded), the judge's own `pytest.ini` (`-c`), `--noconftest`,
no plugin autoloading; the project is put last on `sys.path`, behind everything
installed.

The verdict is read from outside the sandbox: the judge's plugin (`verdict.py`) writes
each test's outcome to a file of the judge's through a descriptor it hands over, and
pytest's exit status comes from bwrap. Both must agree: a run that did not reach the
end of pytest's session (the code under test exited, or was killed) did not run the
tests, whatever it printed or wrote. No file in the task directory counts. And a pass
must name every test the reference solution passes (`judge_project`).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from gateway_tools.eval import sandbox, verdict
from gateway_tools.eval.suite import Task

HIDDEN_TESTS = "_hidden_tests"
# The judge's plugin and configuration, mounted read-only at this path in the sandbox.
_JUDGE_DIR = "/judge"
_PLUGIN = "gateway_eval_verdict"
# pytest's "no tests ran" and "usage error": the tests could not be judged at all.
_NO_TESTS, _USAGE = 5, 4
_FILE_TOO_LARGE = "[Errno 27] File too large"
_DISK_FULL = "[Errno 28] No space left on device"
# Plain pytest, whatever plugins the environment has installed: the same judge everywhere,
# and 0.3 s a run instead of 2 s with this project's dev plugins.
_PYTEST_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONPATH": _JUDGE_DIR}


@dataclass(slots=True)
class TestRun:
    """The hidden tests' verdict on one working copy."""

    passed: bool
    reason: str | None  # why not, when not
    tests_passed: list[str] = field(default_factory=list)
    tests_failed: list[str] = field(default_factory=list)
    duration_s: float = 0.0


@contextmanager
def working_copy(task: Task) -> Iterator[Path]:
    """A fresh copy of the task's snapshot in a temporary directory, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix=f"eval-{task.id}-") as scratch:
        project = Path(scratch) / "project"
        shutil.copytree(task.snapshot_directory, project)
        yield project


def run_hidden_tests(task: Task, project: Path, limits: sandbox.Limits) -> TestRun:
    """Copy the hidden tests into `project` and run them there, in the sandbox."""
    tests = project / HIDDEN_TESTS
    # Whatever the answer put there (a directory, a file, a link) makes way.
    if tests.is_dir() and not tests.is_symlink():
        shutil.rmtree(tests)
    else:
        tests.unlink(missing_ok=True)
    shutil.copytree(task.tests_directory, tests)
    with tempfile.TemporaryDirectory(prefix="eval-judge-") as scratch:
        plugin = Path(scratch) / "plugin"
        plugin.mkdir()
        shutil.copyfile(verdict.__file__, plugin / f"{_PLUGIN}.py")
        (plugin / "pytest.ini").write_text("[pytest]\n")
        report = Path(scratch) / "results.jsonl"
        channel = os.open(report, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        command = [
            sys.executable, "-P", "-s", "-m", "pytest", "-q", "-c", f"{_JUDGE_DIR}/pytest.ini",
            f"--rootdir={sandbox.TASK_DIR}", "-p", _PLUGIN, "-p", "no:cacheprovider",
            "--noconftest", HIDDEN_TESTS,
        ]  # fmt: skip
        try:
            outcome = sandbox.run(
                command,
                project,
                limits,
                env={**_PYTEST_ENV, verdict.FD_ENV: str(channel)},
                read_only=(HIDDEN_TESTS,),
                mounts={_JUDGE_DIR: plugin},
                pass_fds=(channel,),
            )
        finally:
            os.close(channel)
        results = verdict.read(report)
    return _judged(outcome, results, limits)


def _judged(outcome: sandbox.Outcome, results: verdict.Results, limits: sandbox.Limits) -> TestRun:
    """The verdict on one run: from the sandbox's outcome and the plugin's results."""
    passed, failed = _names(results.passed), _names(results.failed)
    output = outcome.stdout + outcome.stderr
    if outcome.stopped is None and _FILE_TOO_LARGE in output:
        # Python ignores SIGXFSZ: the write fails with EFBIG and the tests report it.
        outcome = dataclasses.replace(outcome, stopped="file_size")
    if outcome.stopped == "file_size":
        reason = f"sandbox: file_size (limit {limits.file_bytes} bytes)"
        return TestRun(False, reason, passed, failed, outcome.duration_s)
    if outcome.stopped is None and _DISK_FULL in output:
        # The task's tmpfs is full: the write fails with ENOSPC and the tests report it.
        reason = f"sandbox: disk (limit {limits.disk_bytes} bytes)"
        return TestRun(False, reason, passed, failed, outcome.duration_s)
    if outcome.stopped is not None:
        reason = (
            f"sandbox: {outcome.stopped} (limit {limits.wall_s:g} s)"
            if outcome.stopped == "timeout"
            else f"sandbox: {outcome.stopped}"
        )
        return TestRun(False, reason, passed, failed, outcome.duration_s)
    tail = (output.strip().splitlines() or ["no output"])[-1][:200]
    if results.exitstatus is None or results.exitstatus != outcome.returncode:
        # pytest never reached the end of its session: whatever the run printed, the
        # tests were not all run (the code under test exited, or took pytest's place).
        reason = (
            f"tests did not run: pytest did not finish (exit status {outcome.returncode}): {tail}"
        )
        return TestRun(False, reason, passed, failed, outcome.duration_s)
    if outcome.returncode in (_NO_TESTS, _USAGE) or (not passed and not failed):
        return TestRun(False, f"tests did not run: {tail}", passed, failed, outcome.duration_s)
    if outcome.returncode != 0 or failed:
        return TestRun(
            False,
            f"tests failed: {len(failed)} of {len(passed) + len(failed)}",
            passed,
            failed,
            outcome.duration_s,
        )
    return TestRun(True, None, passed, failed, outcome.duration_s)


def judge_project(task: Task, project: Path, limits: sandbox.Limits) -> TestRun:
    """The hidden tests' verdict on an answer applied in `project`. The code under test
    runs in pytest's own process, where it could write a verdict of its own making to
    the plugin's channel: so a pass must name every test the reference solution passes
    (a forger then has to forge each one by name; it cannot be kept out of the process
    whose tests it is)."""
    verdict = run_hidden_tests(task, project, limits)
    if not verdict.passed:
        return verdict
    missing = sorted(expected_tests(task, limits) - set(verdict.tests_passed))
    if not missing:
        return verdict
    reason = (
        f"tests did not run: {len(missing)} of the hidden tests reported no result "
        f"(first: {missing[0]})"
    )
    return dataclasses.replace(verdict, passed=False, reason=reason)


# Per task (its tests' directory), the names of the tests its reference solution passes.
_EXPECTED: dict[Path, frozenset[str]] = {}


def expected_tests(task: Task, limits: sandbox.Limits) -> frozenset[str]:
    """The tests the task's reference solution passes, from a run of it (by `verify`, or
    once per task and process)."""
    if task.tests_directory not in _EXPECTED:
        _run_reference(task, limits)
    return _EXPECTED[task.tests_directory]


def _run_reference(task: Task, limits: sandbox.Limits) -> TestRun:
    """The hidden tests on the task's reference solution; the tests it passes are kept
    for `expected_tests`."""
    with working_copy(task) as project:
        shutil.copytree(task.solution_directory, project, dirs_exist_ok=True)
        reference = run_hidden_tests(task, project, limits)
    _EXPECTED[task.tests_directory] = frozenset(reference.tests_passed)
    return reference


def verify(task: Task, limits: sandbox.Limits) -> str | None:
    """Why the task cannot judge answers, or None: its snapshot must fail its hidden tests
    and its reference solution must pass them."""
    if task.problem is not None:
        return task.problem
    with working_copy(task) as project:
        before = run_hidden_tests(task, project, limits)
    if before.passed:
        return "the snapshot already passes the hidden tests: they judge nothing"
    after = _run_reference(task, limits)
    if not after.passed:
        return f"the reference solution does not pass the hidden tests ({after.reason})"
    return None


def _names(node_ids: list[str]) -> list[str]:
    """pytest's node ids as the record names tests: `_hidden_tests/test_x.py::TestY::test_z`
    is `test_x.TestY::test_z` (a module that did not collect is `test_x`)."""
    names = []
    for node_id in node_ids:
        path, *parts = node_id.split("::")
        module = path.removeprefix(f"{HIDDEN_TESTS}/").removesuffix(".py").replace("/", ".")
        names.append("::".join([".".join([module, *parts[:-1]]), *parts[-1:]]))
    return names
