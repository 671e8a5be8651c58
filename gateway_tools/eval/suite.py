"""Task suites as files, loaded and checked.

    evals/suites/<suite>/suite.yaml          name, version, language, description
    evals/suites/<suite>/tasks/<id>/task.yaml       id, title, category, kind, language,
                                                    expected_files
    evals/suites/<suite>/tasks/<id>/instruction.md  what is asked (sent)
    evals/suites/<suite>/tasks/<id>/snapshot/       the project as it is (sent)
    evals/suites/<suite>/tasks/<id>/tests/          hidden tests (never sent)
    evals/suites/<suite>/tasks/<id>/solution/       the reference solution: whole files
                                                    that replace the snapshot's (never sent)

Loading never fails on one bad task: a task that lacks a part, or whose metadata is
wrong, is loaded with the `problem` that makes it malformed, and every attempt at it is
recorded as a failure with that reason. Whether the reference solution passes the hidden
tests (and the snapshot does not) is checked by `gateway_tools.eval.verify`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway_tools.eval.yaml_files import read_yaml

CATEGORIES = ("single-file", "cross-file")
KINDS = ("bug-fix", "feature", "refactor")
_ID = re.compile(r"^[a-z0-9][a-z0-9-]*$")
# Files a suite never holds as content: bytecode and caches left by running its tests.
_IGNORED = ("__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache")


@dataclass(frozen=True, slots=True)
class Task:
    """One task of a suite."""

    id: str
    directory: Path
    title: str = ""
    category: str = "single-file"
    kind: str = ""
    language: str = "python"
    expected_files: tuple[str, ...] = ()
    instruction: str = ""
    snapshot: tuple[tuple[str, str], ...] = ()  # (path, text), sorted by path
    digest: str = ""  # of everything the task holds, sent or not
    problem: str | None = None  # why the task is malformed; None when it is well formed

    @property
    def tests_directory(self) -> Path:
        return self.directory / "tests"

    @property
    def solution_directory(self) -> Path:
        return self.directory / "solution"

    @property
    def snapshot_directory(self) -> Path:
        return self.directory / "snapshot"


@dataclass(frozen=True, slots=True)
class Suite:
    """A suite: its metadata and its tasks, sorted by id."""

    name: str
    version: str
    language: str
    description: str
    directory: Path
    tasks: tuple[Task, ...]
    digest: str  # of suite.yaml and every task's digest

    def task(self, task_id: str) -> Task:
        for task in self.tasks:
            if task.id == task_id:
                return task
        raise KeyError(task_id)


class SuiteError(Exception):
    """The suite as a whole cannot be used (no suite.yaml, no tasks)."""


def load_suite(directory: Path) -> Suite:
    """Load the suite in `directory`; SuiteError when it is not a suite at all."""
    meta_path = directory / "suite.yaml"
    if not meta_path.is_file():
        raise SuiteError(f"{directory}: no suite.yaml: not a task suite")
    meta = _yaml_mapping(meta_path)
    if isinstance(meta, str):
        raise SuiteError(meta)
    task_dirs = sorted(p for p in (directory / "tasks").glob("*") if p.is_dir())
    if not task_dirs:
        raise SuiteError(f"{directory}/tasks: no tasks")
    tasks = tuple(load_task(path) for path in task_dirs)
    digest = hashlib.sha256(meta_path.read_bytes())
    for task in tasks:
        digest.update(f"\0{task.id}\0{task.digest}".encode())
    return Suite(
        name=str(meta.get("name") or directory.name),
        version=str(meta.get("version", "")),
        language=str(meta.get("language", "python")),
        description=str(meta.get("description", "")),
        directory=directory,
        tasks=tasks,
        digest=digest.hexdigest(),
    )


def load_task(directory: Path) -> Task:
    """Load one task; a malformed one comes back with its `problem` set."""
    digest = _tree_digest(directory)
    problem = _structure_problem(directory)
    if problem is not None:
        return Task(id=directory.name, directory=directory, digest=digest, problem=problem)
    meta = _yaml_mapping(directory / "task.yaml")
    if isinstance(meta, str):
        return Task(id=directory.name, directory=directory, digest=digest, problem=meta)
    snapshot = tuple(_texts(directory / "snapshot"))
    task = Task(
        id=directory.name,
        directory=directory,
        title=str(meta.get("title", "")),
        category=str(meta.get("category", "")),
        kind=str(meta.get("kind", "")),
        language=str(meta.get("language", "python")),
        expected_files=tuple(str(p) for p in meta.get("expected_files") or ()),
        instruction=(directory / "instruction.md").read_text().strip(),
        snapshot=snapshot,
        digest=digest,
    )
    problem = _metadata_problem(task, meta)
    if problem is not None:
        return Task(id=task.id, directory=directory, digest=digest, problem=problem)
    return task


def _structure_problem(directory: Path) -> str | None:
    name = directory.name
    if not _ID.match(name):
        return f"task directory {name!r}: use lowercase letters, digits and '-'"
    if not (directory / "task.yaml").is_file():
        return "no task.yaml"
    instruction = directory / "instruction.md"
    if not instruction.is_file() or not instruction.read_text().strip():
        return "no instruction (instruction.md is missing or empty)"
    if not any(_files(directory / "snapshot")):
        return "no snapshot (snapshot/ is missing or empty)"
    if not any(p.name.startswith("test_") for p in _files(directory / "tests")):
        return "no hidden tests (tests/ holds no test_*.py)"
    if not any(_files(directory / "solution")):
        return "no reference solution (solution/ is missing or empty)"
    return None


def _metadata_problem(task: Task, meta: dict[str, Any]) -> str | None:
    where = f"{task.directory / 'task.yaml'}"
    if meta.get("id", task.id) != task.id:
        return f"{where}: id {meta.get('id')!r} is not the directory's name {task.id!r}"
    if task.category not in CATEGORIES:
        return f"{where}: category {task.category!r}: use one of {', '.join(CATEGORIES)}"
    if task.kind not in KINDS:
        return f"{where}: kind {task.kind!r}: use one of {', '.join(KINDS)}"
    solution = sorted(path for path, _ in _texts(task.solution_directory))
    if sorted(task.expected_files) != solution:
        expected = sorted(task.expected_files)
        return f"{where}: expected_files {expected} are not the solution's files {solution}"
    if task.category == "cross-file" and len(solution) < 2:
        return f"{where}: a cross-file task's solution changes one file only"
    return None


def _yaml_mapping(path: Path) -> dict[str, Any] | str:
    """The YAML mapping in `path`, or `file:line: why` when it is not one."""
    try:
        data = read_yaml(path, "file")
    except ValueError as exc:
        return str(exc)
    if not isinstance(data, dict):
        return f"{path}:1: expected a mapping"
    return data


def _files(directory: Path) -> Iterable[Path]:
    if not directory.is_dir():
        return ()
    return (
        p for p in sorted(directory.rglob("*"))
        if p.is_file() and not any(part in _IGNORED for part in p.parts) and p.suffix != ".pyc"
    )  # fmt: skip


def _texts(directory: Path) -> Iterable[tuple[str, str]]:
    for path in _files(directory):
        yield path.relative_to(directory).as_posix(), path.read_text(errors="replace")


def _tree_digest(directory: Path) -> str:
    digest = hashlib.sha256()
    for path in _files(directory):
        digest.update(path.relative_to(directory).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()
