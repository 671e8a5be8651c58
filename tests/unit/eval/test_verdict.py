"""Reading the judge's plugin's results: which tests passed, which failed, and whether
pytest finished. The plugin itself runs in the sandbox in every judge test."""

from __future__ import annotations

import json
from pathlib import Path

from gateway_tools.eval.verdict import Results, read


def written(path: Path, *lines: object) -> Path:
    path.write_text(
        "".join(f"{json.dumps(line) if isinstance(line, dict) else line}\n" for line in lines)
    )
    return path


def test_a_test_passes_when_its_call_passed_and_no_phase_failed(tmp_path: Path) -> None:
    results = read(
        written(
            tmp_path / "r.jsonl",
            {"test": "t.py::ok", "when": "setup", "outcome": "passed"},
            {"test": "t.py::ok", "when": "call", "outcome": "passed"},
            {"test": "t.py::bad_teardown", "when": "call", "outcome": "passed"},
            {"test": "t.py::bad_teardown", "when": "teardown", "outcome": "failed"},
            {"test": "t.py::wrong", "when": "call", "outcome": "failed"},
            {"test": "t.py", "when": "collect", "outcome": "failed"},
            {"exitstatus": 1},
        )
    )
    assert results == Results(
        passed=["t.py::ok"], failed=["t.py::bad_teardown", "t.py::wrong", "t.py"], exitstatus=1
    )


def test_a_skipped_test_is_not_a_passed_one(tmp_path: Path) -> None:
    results = read(
        written(
            tmp_path / "r.jsonl",
            {"test": "t.py::skipped", "when": "call", "outcome": "skipped"},
            {"exitstatus": 0},
        )
    )
    assert (results.passed, results.failed) == ([], ["t.py::skipped"])


def test_garbage_is_ignored_and_a_run_without_its_end_never_finished(tmp_path: Path) -> None:
    results = read(
        written(
            tmp_path / "r.jsonl",
            "not json",
            "[1, 2]",
            {"test": "t.py::ok", "when": "call", "outcome": "passed"},
        )
    )
    assert results == Results(passed=["t.py::ok"], exitstatus=None)
    assert read(tmp_path / "missing.jsonl") == Results()
