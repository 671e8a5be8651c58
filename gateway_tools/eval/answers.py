"""A model's answer as a change to the project: whole files, or a unified diff.

Whole files are fenced code blocks each preceded by the file's path (on a line of its
own: `FILE: path`, `### path`, `**path**` or `` `path` ``). A diff is a ```diff or
```patch block, or a bare diff (`--- a/...` then `+++ b/...`); it is applied with
`git apply`, which refuses a hunk that does not fit and any path outside the project.

An answer that is neither, a diff that does not apply, or a path that leaves the
project or touches the hidden tests or pytest's configuration is an `AnswerError`:
a failed attempt with its reason.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from gateway_tools.eval.judge import HIDDEN_TESTS

_GIT = shutil.which("git")
# A path line: `FILE: a/b.py`, `### a/b.py`, `**a/b.py**`, `` `a/b.py` `` or `a/b.py:`.
_PATH_LINE = re.compile(
    r"^\s*(?:FILE:\s*|#+\s*|\*\*|`)?(?P<path>[\w./-]+\.[A-Za-z0-9]+)(?:\*\*|`)?:?\s*$"
)
_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+.-]*)[^\n]*$")
_DIFF_BLOCK = re.compile(r"^(`{3,})\s*(?:diff|patch|udiff)\s*\n(.*?)^\1\s*$", re.M | re.S)
_BARE_DIFF = re.compile(r"^--- \S.*\n\+\+\+ \S", re.M)
_DIFF_PATH = re.compile(r"^(?:\+\+\+|---) (?P<path>\S+)", re.M)
# What an answer may not write: it would judge itself.
_FORBIDDEN_NAMES = ("conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml")


class AnswerError(Exception):
    """The answer cannot be applied; the message says why."""


@dataclass(frozen=True, slots=True)
class Change:
    """What an answer changes: `files` (path to new text) or a `diff`."""

    form: str  # "files" or "diff"
    files: tuple[tuple[str, str], ...] = ()
    diff: str = ""

    @property
    def paths(self) -> list[str]:
        """The project paths the change touches."""
        if self.form == "files":
            return sorted(path for path, _ in self.files)
        found = {m.group("path") for m in _DIFF_PATH.finditer(self.diff)}
        return sorted({_strip_prefix(p) for p in found if p != "/dev/null"})


def parse_answer(text: str) -> Change:
    """The change an answer holds; AnswerError when it holds none."""
    block = _DIFF_BLOCK.search(text)
    if block is not None:
        return _checked(Change("diff", diff=block.group(2)))
    files = _file_blocks(text)
    if files:
        return _checked(Change("files", files=tuple(files)))
    if _BARE_DIFF.search(text):
        return _checked(Change("diff", diff=text[_BARE_DIFF.search(text).start() :]))  # type: ignore[union-attr]
    snippet = " ".join(text.split())[:80]
    raise AnswerError(f"the answer holds neither whole files nor a diff: {snippet!r}")


def apply(change: Change, project: Path) -> None:
    """Apply `change` to the project directory; AnswerError when it does not apply."""
    if change.form == "files":
        for path, content in change.files:
            target = project / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
        return
    if _GIT is None:
        raise AnswerError("cannot apply a diff: git is not installed")
    diff = (change.diff if change.diff.endswith("\n") else change.diff + "\n").encode()
    # As written first; then with the hunks' line counts recounted, which models often
    # get wrong (recounting can misread a correct diff, so it is only the second try).
    for options in ([], ["--recount"]):
        result = subprocess.run(
            [_GIT, "apply", *options, "--whitespace=nowarn", "-"],
            cwd=project,
            input=diff,
            capture_output=True,
            timeout=30,
        )
        if result.returncode == 0:
            return
    why = result.stderr.decode(errors="replace").strip().splitlines()
    raise AnswerError(f"the diff does not apply: {why[0] if why else 'git apply failed'}")


def _file_blocks(text: str) -> list[tuple[str, str]]:
    """(path, content) of each fenced block preceded by a path line."""
    lines = text.splitlines()
    files: dict[str, str] = {}
    index = 0
    while index < len(lines):
        fence = _FENCE.match(lines[index])
        if fence is None:
            index += 1
            continue
        path = _path_before(lines, index)
        close = fence.group(2)
        end = index + 1
        while end < len(lines) and lines[end].strip() != close:
            end += 1
        if path is not None:
            files[path] = "\n".join(lines[index + 1 : end]) + "\n"
        index = end + 1
    return sorted(files.items())


def _path_before(lines: list[str], fence: int) -> str | None:
    for back in range(fence - 1, max(fence - 3, -1), -1):
        line = lines[back].strip()
        if not line:
            continue
        match = _PATH_LINE.match(line)
        return match.group("path") if match else None
    return None


def _strip_prefix(path: str) -> str:
    return path[2:] if path.startswith(("a/", "b/")) else path


def _checked(change: Change) -> Change:
    for path in change.paths:
        pure = PurePosixPath(path)
        if pure.is_absolute() or ".." in pure.parts or not pure.parts:
            raise AnswerError(f"the answer writes outside the project: {path!r}")
        if pure.parts[0] == HIDDEN_TESTS or pure.name in _FORBIDDEN_NAMES:
            raise AnswerError(f"the answer writes the tests or their configuration: {path!r}")
    return change
