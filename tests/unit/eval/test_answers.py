"""An answer as a change to a project: whole files or a diff, applied or refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway_tools.eval.answers import AnswerError, apply, parse_answer

OLD = "def add(a, b):\n    return a - b\n"
NEW = "def add(a, b):\n    return a + b\n"
DIFF = """--- a/calc/ops.py
+++ b/calc/ops.py
@@ -1,2 +1,2 @@
 def add(a, b):
-    return a - b
+    return a + b
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "calc").mkdir()
    (tmp_path / "calc" / "ops.py").write_text(OLD)
    return tmp_path


@pytest.mark.parametrize(
    "header", ["FILE: calc/ops.py", "### calc/ops.py", "**calc/ops.py**", "`calc/ops.py`"]
)
def test_whole_files_after_a_path_line_are_written(project: Path, header: str) -> None:
    answer = f"Here you go.\n\n{header}\n```python\n{NEW}```\n\nDone."
    change = parse_answer(answer)
    assert (change.form, change.paths) == ("files", ["calc/ops.py"])
    apply(change, project)
    assert (project / "calc" / "ops.py").read_text() == NEW


def test_several_files_and_a_new_one(project: Path) -> None:
    answer = f"FILE: calc/ops.py\n```\n{NEW}```\nFILE: calc/more.py\n```python\nX = 1\n```\n"
    change = parse_answer(answer)
    assert change.paths == ["calc/more.py", "calc/ops.py"]
    apply(change, project)
    assert (project / "calc" / "more.py").read_text() == "X = 1\n"


@pytest.mark.parametrize("wrap", ["```diff\n{}```\n", "```patch\n{}```", "Sure:\n{}"])
def test_a_unified_diff_is_applied(project: Path, wrap: str) -> None:
    change = parse_answer(wrap.format(DIFF))
    assert (change.form, change.paths) == ("diff", ["calc/ops.py"])
    apply(change, project)
    assert (project / "calc" / "ops.py").read_text() == NEW


def test_a_diff_with_wrong_line_counts_still_applies(project: Path) -> None:
    miscounted = DIFF.replace("@@ -1,2 +1,2 @@", "@@ -1,5 +1,7 @@")
    apply(parse_answer(f"```diff\n{miscounted}```"), project)
    assert (project / "calc" / "ops.py").read_text() == NEW


def test_a_diff_that_does_not_fit_is_refused_and_changes_nothing(project: Path) -> None:
    stale = DIFF.replace("return a - b", "return a * b")
    with pytest.raises(AnswerError, match="does not apply"):
        apply(parse_answer(f"```diff\n{stale}```"), project)
    assert (project / "calc" / "ops.py").read_text() == OLD


@pytest.mark.parametrize(
    "answer",
    ["I'm sorry, I can't help with that.", "```python\nprint('no path')\n```", ""],
)
def test_neither_files_nor_a_diff(answer: str) -> None:
    with pytest.raises(AnswerError, match="neither whole files nor a diff"):
        parse_answer(answer)


@pytest.mark.parametrize(
    "path", ["../escape.py", "/etc/passwd.txt", "_hidden_tests/test_x.py", "conftest.py",
             "calc/conftest.py", "pytest.ini"],
)  # fmt: skip
def test_paths_outside_the_project_or_at_the_tests_are_refused(path: str) -> None:
    with pytest.raises(AnswerError, match=r"outside the project|tests or their configuration"):
        parse_answer(f"FILE: {path}\n```\nx = 1\n```\n")


def test_a_diff_that_writes_outside_the_project_is_refused() -> None:
    escaping = DIFF.replace("a/calc/ops.py", "a/../ops.py").replace("b/calc/ops.py", "b/../ops.py")
    with pytest.raises(AnswerError, match="outside the project"):
        parse_answer(f"```diff\n{escaping}```")
