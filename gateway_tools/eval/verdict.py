"""The hidden tests' results, from pytest to the judge: a pytest plugin, and its reader.

The judge loads this file into pytest inside the sandbox (`-p`, as a module of its own,
from a read-only mount: the `gateway` package is not there). It writes one JSON line per
test phase and one for the session's end to a file descriptor the judge hands over; the
file it writes to is the judge's, outside the sandbox, reachable by no path from inside.
The judge reads it with `read` and checks it against pytest's exit status as bwrap
reports it.

Inside the sandbox this module is imported before pytest collects the hidden tests (and
with them the code under test), and it imports nothing afterwards: the code under test
cannot replace a module it uses. Standard library only.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The descriptor to write to, given by the judge in the environment.
FD_ENV = "GATEWAY_EVAL_VERDICT_FD"
# Read at most this much: the code under test could write to the file too.
_READ_LIMIT = 4 << 20
_fd: int | None = None


def pytest_configure(config: Any) -> None:
    """Take the judge's descriptor; put the project last on `sys.path` (the hidden tests
    import it; last, so that it replaces no installed module, pytest's included)."""
    global _fd
    given = os.environ.get(FD_ENV)
    _fd = int(given) if given is not None else None
    sys.path.append(str(config.rootpath))


def pytest_collectreport(report: Any) -> None:
    """A test module that could not be collected (the code under test does not import)."""
    if report.failed:
        _write({"test": report.nodeid, "when": "collect", "outcome": "failed"})


def pytest_runtest_logreport(report: Any) -> None:
    """Each phase of each test: setup, call, teardown."""
    _write({"test": report.nodeid, "when": report.when, "outcome": report.outcome})


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    """The session's end: pytest finished, with this exit status."""
    _write({"exitstatus": int(exitstatus)})


def _write(record: dict[str, Any]) -> None:
    if _fd is not None:
        os.write(_fd, (json.dumps(record) + "\n").encode())


@dataclass(slots=True)
class Results:
    """What the plugin reported: test node ids that passed and failed, and the exit
    status pytest finished with (None: it never finished). A failed phase or collection
    fails its test, and so does a skip: the hidden tests are all meant to run, and the
    code under test could skip (`pytest.skip`) those it would fail."""

    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    exitstatus: int | None = None


def read(path: Path) -> Results:
    """The results the plugin wrote to `path` (empty when it wrote none)."""
    try:
        with path.open("rb") as file:
            lines = file.read(_READ_LIMIT).decode(errors="replace").splitlines()
    except OSError:
        return Results()
    outcomes: dict[str, set[tuple[str, str]]] = {}
    results = Results()
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        if isinstance(record.get("exitstatus"), int):
            results.exitstatus = record["exitstatus"]
        elif isinstance(record.get("test"), str):
            phases = outcomes.setdefault(record["test"], set())
            phases.add((str(record.get("when")), str(record.get("outcome"))))
    for test, phases in outcomes.items():
        if any(outcome in ("failed", "skipped") for _, outcome in phases):
            results.failed.append(test)
        elif ("call", "passed") in phases:
            results.passed.append(test)
    return results
