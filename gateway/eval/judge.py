"""Judge a solution: a fresh copy of the task's snapshot, the hidden tests run on it in
the sandbox, and which tests passed.

The hidden tests are copied in after the answer is applied, into `_hidden_tests/`, and
run with `python -m pytest --noconftest` and no plugin autoloading: nothing the answer
writes (a `conftest.py`, a plugin) is loaded by pytest, and the answer cannot replace
the tests.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from gateway.eval import sandbox
from gateway.eval.suite import Task

HIDDEN_TESTS = "_hidden_tests"
_REPORT = "pytest-report.xml"
# pytest's "no tests ran" and "usage error": the tests could not be judged at all.
_NO_TESTS, _USAGE = 5, 4
_FILE_TOO_LARGE = "[Errno 27] File too large"
# Plain pytest, whatever plugins the environment has installed: the same judge everywhere,
# and 0.3 s a run instead of 2 s with this project's dev plugins.
_PYTEST_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


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
    shutil.rmtree(tests, ignore_errors=True)
    shutil.copytree(task.tests_directory, tests)
    report = project.parent / _REPORT
    report.unlink(missing_ok=True)
    command = [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest",
        f"--junit-xml={report}", "-o", "junit_family=xunit1", HIDDEN_TESTS,
    ]  # fmt: skip
    outcome = sandbox.run(command, project, limits, env=_PYTEST_ENV)
    passed, failed = _read_report(report)
    if outcome.stopped is None and _FILE_TOO_LARGE in outcome.stdout + outcome.stderr:
        # Python ignores SIGXFSZ: the write fails with EFBIG and the tests report it.
        outcome = dataclasses.replace(outcome, stopped="file_size")
    if outcome.stopped == "file_size":
        reason = f"sandbox: file_size (limit {limits.file_bytes} bytes)"
        return TestRun(False, reason, passed, failed, outcome.duration_s)
    if outcome.stopped is not None:
        reason = (
            f"sandbox: {outcome.stopped} (limit {limits.wall_s:g} s)"
            if outcome.stopped == "timeout"
            else f"sandbox: {outcome.stopped}"
        )
        return TestRun(False, reason, passed, failed, outcome.duration_s)
    if outcome.returncode in (_NO_TESTS, _USAGE) or (not passed and not failed):
        tail = (outcome.stdout + outcome.stderr).strip().splitlines()[-1:] or ["no output"]
        return TestRun(
            False, f"tests did not run: {tail[0][:200]}", passed, failed, outcome.duration_s
        )
    if outcome.returncode != 0 or failed:
        return TestRun(
            False,
            f"tests failed: {len(failed)} of {len(passed) + len(failed)}",
            passed,
            failed,
            outcome.duration_s,
        )
    return TestRun(True, None, passed, failed, outcome.duration_s)


def verify(task: Task, limits: sandbox.Limits) -> str | None:
    """Why the task cannot judge answers, or None: its snapshot must fail its hidden tests
    and its reference solution must pass them."""
    if task.problem is not None:
        return task.problem
    with working_copy(task) as project:
        before = run_hidden_tests(task, project, limits)
    if before.passed:
        return "the snapshot already passes the hidden tests: they judge nothing"
    with working_copy(task) as project:
        shutil.copytree(task.solution_directory, project, dirs_exist_ok=True)
        after = run_hidden_tests(task, project, limits)
    if not after.passed:
        return f"the reference solution does not pass the hidden tests ({after.reason})"
    return None


def _read_report(path: Path) -> tuple[list[str], list[str]]:
    """Passed and failed test ids from pytest's JUnit XML (empty when there is none)."""
    try:
        root = ElementTree.parse(path).getroot()
    except (OSError, ElementTree.ParseError):
        return [], []
    passed, failed = [], []
    for case in root.iter("testcase"):
        module = case.get("classname", "").removeprefix(f"{HIDDEN_TESTS}.")
        name = f"{module}::{case.get('name', '')}"
        if any(child.tag in ("failure", "error") for child in case):
            failed.append(name)
        elif not any(child.tag == "skipped" for child in case):
            passed.append(name)
    return passed, failed
