"""Judging an answer: the hidden tests on a fresh snapshot, in the sandbox. Hostile or
broken answers are failed attempts with their reason; the run goes on."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from gateway_tools.eval.records import Attempt
from gateway_tools.eval.runner import TEST_LIMITS, judge_answer
from gateway_tools.eval.suite import Task, load_task
from tests.unit.eval.tasks import write_task

LIMITS = dataclasses.replace(TEST_LIMITS, wall_s=8.0, file_bytes=1 << 20)


@pytest.fixture
def task(tmp_path: Path) -> Task:
    return load_task(write_task(tmp_path))


def judged(task: Task, body: str) -> Attempt:
    attempt = Attempt(candidate="m", task=task.id, attempt=0, category=task.category, passed=False)
    judge_answer(attempt, task, f"FILE: calc/ops.py\n```python\n{body}\n```\n", LIMITS)
    return attempt


def test_a_right_answer_passes_and_names_its_tests(task: Task) -> None:
    attempt = judged(task, "def add(a, b):\n    return a + b")
    assert (attempt.passed, attempt.reason) == (True, None)
    assert attempt.tests_passed == ["test_ops::test_add", "test_ops::test_zero"]
    assert (attempt.answer_form, attempt.files_touched) == ("files", ["calc/ops.py"])
    assert attempt.expected_files_touched


def test_a_wrong_answer_fails_naming_the_failed_tests(task: Task) -> None:
    attempt = judged(task, "def add(a, b):\n    return a * b")
    assert (attempt.passed, attempt.reason) == (False, "tests failed: 1 of 2")
    assert attempt.tests_failed == ["test_ops::test_add"]
    assert attempt.tests_passed == ["test_ops::test_zero"]


def test_each_attempt_gets_a_fresh_snapshot(task: Task) -> None:
    judged(task, "def add(a, b):\n    return a + b")
    assert (task.snapshot_directory / "calc" / "ops.py").read_text().endswith("a - b\n")
    assert judged(task, "raise SystemExit(0)").passed is False


FORGER = """import json, os
channel = int(os.environ["GATEWAY_EVAL_VERDICT_FD"])
for line in ({"test": "_hidden_tests/test_ops.py::test_forged", "when": "call",
              "outcome": "passed"}, {"exitstatus": 0}):
    os.write(channel, (json.dumps(line) + "\\n").encode())
os._exit(0)"""


def test_an_answer_that_writes_a_verdict_of_its_own_does_not_pass(task: Task) -> None:
    # It runs in pytest's process, at import, and reports a pass for a test of its own.
    attempt = judged(task, FORGER)
    assert attempt.passed is False
    assert attempt.reason == (
        "tests did not run: 2 of the hidden tests reported no result (first: test_ops::test_add)"
    )
    assert attempt.tests_passed == ["test_ops::test_forged"]


def test_a_solution_that_loops_forever_is_stopped(task: Task) -> None:
    attempt = judged(task, "while True:\n    pass")
    assert attempt.passed is False
    assert attempt.reason == "sandbox: timeout (limit 8 s)"


def test_a_solution_that_forks_without_end_is_held(task: Task) -> None:
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    attempt = judged(task, bomb)
    assert attempt.passed is False
    assert attempt.reason is not None and attempt.reason.startswith("sandbox:")


def test_a_solution_that_fills_the_disk_is_stopped(task: Task) -> None:
    attempt = judged(
        task, "with open('big', 'wb') as f:\n    while True:\n        f.write(b'x' * 65536)"
    )
    assert attempt.passed is False
    assert attempt.reason == f"sandbox: file_size (limit {LIMITS.file_bytes} bytes)"


def test_a_solution_that_fills_the_task_s_disk_with_many_files_is_stopped(task: Task) -> None:
    # Each file under the size limit, all of them past the task's disk.
    limits = dataclasses.replace(LIMITS, disk_bytes=8 << 20)
    attempt = Attempt(candidate="m", task=task.id, attempt=0, category=task.category, passed=False)
    many = (
        "for i in range(64):\n"
        "    with open(f'part{i}', 'wb') as f:\n"
        "        f.write(b'x' * (512 << 10))"
    )
    judge_answer(attempt, task, f"FILE: calc/ops.py\n```python\n{many}\n```\n", limits)
    assert attempt.passed is False
    assert attempt.reason == f"sandbox: disk (limit {8 << 20} bytes)"


def test_a_solution_that_reads_the_environment_finds_no_secret(
    task: Task, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GATEWAY_EVAL_KEY", "sk-secret-of-the-caller")
    steal = (
        "import os\nSEEN = dict(os.environ)\n\ndef add(a, b):\n"
        "    assert 'GATEWAY_EVAL_KEY' not in SEEN, SEEN\n    return a + b"
    )
    assert os.environ["GATEWAY_EVAL_KEY"]
    # Code that fails if it sees the caller's key passes: it is not in its environment.
    assert judged(task, steal).passed is True


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ("I can't help with that.", "answer: the answer holds neither whole files nor a diff"),
        ("```diff\n--- a/calc/ops.py\n+++ b/calc/ops.py\n@@ -1 +1 @@\n-nothing like it\n+x\n```",
         "answer: the diff does not apply"),
        ("FILE: ../../outside.py\n```\nx = 1\n```", "answer: the answer writes outside"),
        ("FILE: calc/conftest.py\n```\nx = 1\n```", "answer: the answer writes the tests"),
    ],
)  # fmt: skip
def test_an_answer_that_cannot_be_applied_is_a_failed_attempt(
    task: Task, answer: str, reason: str
) -> None:
    attempt = Attempt(candidate="m", task=task.id, attempt=0, category=task.category, passed=False)
    judge_answer(attempt, task, answer, LIMITS)
    assert attempt.passed is False
    assert attempt.reason is not None and attempt.reason.startswith(reason)
