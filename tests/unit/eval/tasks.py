"""Small synthetic tasks, written to a temporary directory, for the harness's tests."""

from __future__ import annotations

from pathlib import Path

import yaml

SNAPSHOT = {"calc/__init__.py": "", "calc/ops.py": "def add(a, b):\n    return a - b\n"}
SOLUTION = {"calc/ops.py": "def add(a, b):\n    return a + b\n"}
TESTS = {
    "test_ops.py": "from calc.ops import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
    "def test_zero():\n    assert add(0, 0) == 0\n"
}


def write_task(
    root: Path,
    task_id: str = "01-add",
    *,
    snapshot: dict[str, str] | None = None,
    solution: dict[str, str] | None = None,
    tests: dict[str, str] | None = None,
    instruction: str | None = "`add` subtracts: make it add.",
    meta: dict[str, object] | None = None,
) -> Path:
    """A task directory under `root`/tasks; parts given as None-able mappings."""
    directory = root / "tasks" / task_id
    solution = SOLUTION if solution is None else solution
    for part, files in (
        ("snapshot", SNAPSHOT if snapshot is None else snapshot),
        ("solution", solution),
        ("tests", TESTS if tests is None else tests),
    ):
        for path, text in files.items():
            target = directory / part / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
    directory.mkdir(parents=True, exist_ok=True)
    if instruction is not None:
        (directory / "instruction.md").write_text(instruction)
    base = {"id": task_id, "title": "add", "category": "single-file", "kind": "bug-fix",
            "language": "python", "expected_files": sorted(solution)}  # fmt: skip
    (directory / "task.yaml").write_text(yaml.safe_dump({**base, **(meta or {})}))
    suite = root / "suite.yaml"
    if not suite.exists():
        suite.write_text("name: tiny\nversion: 1\nlanguage: python\n")
    return directory
