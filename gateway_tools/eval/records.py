"""What a run leaves on disk: one `Attempt` a line in `attempts.jsonl`, and `manifest.json`.

A run directory is the whole record of a run: `gateway eval report` and `gateway eval
compare` read nothing else. Attempts are appended as they finish (and flushed), so an
interrupted run keeps every finished attempt and a resumed run skips them.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ATTEMPTS_FILE = "attempts.jsonl"
MANIFEST_FILE = "manifest.json"


@dataclass(slots=True)
class Requests:
    """The HTTP requests an attempt made: the last one's answer is the one judged."""

    sent: int = 0  # every request, the first included
    retries: int = 0  # requests after the first
    status_429: int = 0
    status_503: int = 0
    status_5xx: int = 0  # every 5xx, 503 included
    connection_errors: int = 0

    @property
    def refusals(self) -> int:
        """Requests that rate limits or overload refused (429, 503)."""
        return self.status_429 + self.status_503


@dataclass(slots=True)
class Call:
    """One model call a coding tool made, as the gateway's usage ledger recorded it."""

    endpoint: str
    model_served: str
    status: int
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: float = 0.0
    ttft_ms: float | None = None
    fallback: str = ""


@dataclass(slots=True)
class Attempt:
    """One attempt of one candidate at one task."""

    candidate: str
    task: str
    attempt: int  # 0-based: attempt i of --attempts N
    category: str  # the task's: single-file or cross-file
    passed: bool
    # Why it did not pass, when it did not: "answer: ...", "tests failed", "sandbox: timeout",
    # "upstream: ...", "task: ..." (a malformed task), "blocked: ..." (sanitization).
    reason: str | None = None
    tests_passed: list[str] = field(default_factory=list)
    tests_failed: list[str] = field(default_factory=list)
    answer_form: str | None = None  # "files" or "diff"
    files_touched: list[str] = field(default_factory=list)
    expected_files_touched: bool = False  # touched exactly the task's expected files
    ttft_s: float | None = None
    total_s: float | None = None  # request sent to answer complete (retries included)
    tests_s: float | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float | None = None  # tokens at the candidate's price; None without a price
    requests: Requests = field(default_factory=Requests)
    error: str | None = None  # the last upstream error message, if any
    seed: int | None = None
    fallback: str | None = None  # x-gateway-fallback, when the gateway fell back
    # A coding tool's attempt (`--tool`): the tool, the model it was given, its exit
    # status, the id of the key its calls carried, and each of its model calls from the
    # gateway's records under that key; `candidate` is then "tool/model", `total_s` the
    # time to the tool's exit, `ttft_s` its first call's.
    tool: str | None = None
    key_id: str | None = None
    model: str | None = None
    tool_exit: int | None = None
    cached_tokens: int = 0
    calls: list[Call] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.candidate, self.task, self.attempt)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Attempt:
        values = dict(data)
        values["requests"] = Requests(**values.get("requests", {}))
        values["calls"] = [Call(**call) for call in values.get("calls", [])]
        return cls(**values)


def read_attempts(directory: Path) -> list[Attempt]:
    """The attempts recorded in a run directory (a torn last line, from a kill, is dropped)."""
    path = directory / ATTEMPTS_FILE
    if not path.exists():
        return []
    attempts = []
    for line in path.read_text().splitlines():
        try:
            attempts.append(Attempt.from_dict(json.loads(line)))
        except (ValueError, TypeError):
            continue
    return attempts


class AttemptLog:
    """Appends attempts to `attempts.jsonl`, each on disk before the next begins."""

    def __init__(self, directory: Path) -> None:
        self._path = directory / ATTEMPTS_FILE
        self._drop_torn_tail()

    def append(self, attempt: Attempt) -> None:
        with self._path.open("a") as out:
            out.write(attempt.to_json() + "\n")
            out.flush()
            os.fsync(out.fileno())

    def _drop_torn_tail(self) -> None:
        # A run killed mid-write leaves a line without its newline: cut it, so that the
        # next line starts on a line of its own.
        if not self._path.exists():
            return
        data = self._path.read_bytes()
        if data and not data.endswith(b"\n"):
            self._path.write_bytes(data[: data.rfind(b"\n") + 1])


def read_manifest(directory: Path) -> dict[str, Any]:
    """The run's manifest; ValueError names what is wrong when it cannot be read."""
    path = directory / MANIFEST_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(
            f"{directory}: no {MANIFEST_FILE}: not a `gateway eval run` directory"
        ) from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: {exc.msg}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    return data


def write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    """Write the manifest whole (through a temporary file, so a kill never tears it)."""
    path = directory / MANIFEST_FILE
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    temporary.replace(path)
