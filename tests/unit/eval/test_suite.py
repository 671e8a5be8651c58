"""Suites load, and a malformed task is named with its reason, never a crash."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gateway_tools.eval.judge import verify
from gateway_tools.eval.runner import TEST_LIMITS
from gateway_tools.eval.suite import SuiteError, load_suite, load_task
from tests.unit.eval.tasks import SNAPSHOT, SOLUTION, write_task

SHIPPED = Path(__file__).resolve().parents[3] / "evals" / "suites" / "gateway-python"


def test_a_well_formed_task_loads_and_verifies(tmp_path: Path) -> None:
    task = load_task(write_task(tmp_path))
    assert task.problem is None
    assert task.snapshot == tuple(sorted(SNAPSHOT.items()))
    assert task.expected_files == ("calc/ops.py",)
    assert verify(task, TEST_LIMITS) is None


@pytest.mark.parametrize(
    ("build", "problem"),
    [
        (lambda d: shutil.rmtree(d / "tests"), "no hidden tests"),
        (lambda d: (d / "instruction.md").unlink(), "no instruction"),
        (lambda d: (d / "instruction.md").write_text("  \n"), "no instruction"),
        (lambda d: shutil.rmtree(d / "snapshot"), "no snapshot"),
        (lambda d: shutil.rmtree(d / "solution"), "no reference solution"),
        (lambda d: (d / "task.yaml").write_text("id: a: b\n"), "task.yaml:1: not valid YAML"),
        (lambda d: (d / "task.yaml").write_text("category: mixed\n"), "category 'mixed'"),
    ],
)
def test_a_task_missing_a_part_is_malformed(tmp_path: Path, build, problem: str) -> None:  # type: ignore[no-untyped-def]
    directory = write_task(tmp_path)
    build(directory)
    task = load_task(directory)
    assert task.problem is not None and problem in task.problem
    assert verify(task, TEST_LIMITS) == task.problem


def test_expected_files_must_be_the_solutions_files(tmp_path: Path) -> None:
    task = load_task(write_task(tmp_path, meta={"expected_files": ["calc/other.py"]}))
    assert task.problem is not None
    assert (
        "expected_files ['calc/other.py'] are not the solution's files ['calc/ops.py']"
        in task.problem
    )


def test_a_cross_file_task_must_change_two_files(tmp_path: Path) -> None:
    task = load_task(write_task(tmp_path, meta={"category": "cross-file"}))
    assert task.problem is not None and "changes one file only" in task.problem


def test_a_snapshot_that_already_passes_judges_nothing(tmp_path: Path) -> None:
    task = load_task(write_task(tmp_path, snapshot={**SNAPSHOT, **SOLUTION}))
    assert (
        verify(task, TEST_LIMITS)
        == "the snapshot already passes the hidden tests: they judge nothing"
    )


def test_a_reference_solution_that_fails_is_named(tmp_path: Path) -> None:
    wrong = {"calc/ops.py": "def add(a, b):\n    return a * b\n"}
    problem = verify(load_task(write_task(tmp_path, solution=wrong)), TEST_LIMITS)
    assert problem == "the reference solution does not pass the hidden tests (tests failed: 1 of 2)"


def test_the_suite_digest_changes_with_a_hidden_test(tmp_path: Path) -> None:
    directory = write_task(tmp_path)
    before = load_suite(tmp_path).digest
    (directory / "tests" / "test_ops.py").write_text("def test_more():\n    assert True\n")
    assert load_suite(tmp_path).digest != before


def test_a_directory_without_suite_yaml_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SuiteError, match=r"no suite\.yaml"):
        load_suite(tmp_path)


def test_the_shipped_suite_is_well_formed() -> None:
    suite = load_suite(SHIPPED)
    assert len(suite.tasks) >= 15
    assert sum(task.category == "cross-file" for task in suite.tasks) >= 5
    assert [task.id for task in suite.tasks if task.problem] == []
    assert {task.kind for task in suite.tasks} == {"bug-fix", "feature", "refactor"}
