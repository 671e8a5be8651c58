"""`gateway eval compare`: side by side only when the runs compare; otherwise each
difference named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway_tools.eval.compare import NotComparable, compare
from gateway_tools.eval.records import Requests
from tests.unit.eval.test_scoring import (
    attempt,
    large_attempts,
    manifest_of,
    small_attempts,
    write_run,
)


def later_large() -> list[Any]:
    """coder-large, a later run: every judged attempt passes, one retry."""
    return [
        attempt("coder-large", task, category, True, cost=0.25, ttft_s=1.5, total_s=5.0,
                requests=Requests(sent=2 if task == "t1" else 1, retries=1 if task == "t1" else 0))
        for task, category in (("t1", "single-file"), ("t2", "cross-file"),
                               ("t3", "cross-file"), ("t4", "single-file"))
    ]  # fmt: skip


def test_comparable_runs_are_shown_side_by_side_with_the_change(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", [*large_attempts(), *small_attempts()])
    b = write_run(tmp_path / "b", [*later_large(), *small_attempts()])
    text = compare(a, b)
    assert f"A: `{a}`" in text and f"B: `{b}`" in text
    assert "## coder-large" in text and "## coder-small" in text
    assert "| correctness | pass rate | 50.0 % (2/4) | 100.0 % (4/4) | +50.0 pp |" in text
    assert "| speed | time to first token, p50 | 2.00 s | 1.50 s | -0.50 s |" in text
    # 10.15 -> 0.25 (no failure, no manual correction).
    assert (
        "| cost | cost per completed task (with manual corrections) | 10.15 USD | 0.2500 USD | "
        "-9.90 USD |" in text
    )
    assert "| stability | retries | 6 | 1 | -5 |" in text
    # No price for coder-small in either run: no change to show.
    assert "| cost | token cost, all attempts | no price | no price | - |" in text
    assert "Different, without preventing" not in text


def test_identical_settings_compare_with_no_change(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", large_attempts())
    b = write_run(tmp_path / "b", large_attempts())
    text = compare(a, b)
    assert "| correctness | pass rate | 50.0 % (2/4) | 50.0 % (2/4) | +0.0 pp |" in text


def test_a_changed_template_digest_is_refused_and_named(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", large_attempts())
    template = {"name": "code-change", "version": "1", "digest": "c" * 64}
    b = write_run(tmp_path / "b", large_attempts(), template=template)
    with pytest.raises(NotComparable) as caught:
        compare(a, b)
    assert caught.value.differences == [f"template digest: {'b' * 64!r} != {'c' * 64!r}"]
    assert str(caught.value).splitlines()[1].startswith("template digest: ")


def test_every_difference_is_named_on_its_own_line(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", large_attempts())
    changed = manifest_of()
    settings = {**changed["settings"], "sampling": {**changed["settings"]["sampling"],
                                                    "temperature": 0.7}}  # fmt: skip
    template = {**changed["template"], "digest": "c" * 64}
    outbound = {**changed["outbound"], "policy": "block"}
    b = write_run(tmp_path / "b", large_attempts(), settings=settings, template=template,
                  outbound=outbound)  # fmt: skip
    with pytest.raises(NotComparable) as caught:
        compare(a, b)
    names = [d.split(":")[0] for d in caught.value.differences]
    assert names == ["outbound policy", "settings.sampling", "template digest"]
    lines = str(caught.value).splitlines()
    assert lines[1:] == caught.value.differences


def test_a_changed_task_is_refused_naming_the_task(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", large_attempts())
    suite = manifest_of()["suite"]
    tasks = {**suite["tasks"], "t2": {**suite["tasks"]["t2"], "digest": "9" * 64}}
    b = write_run(tmp_path / "b", large_attempts(), suite={**suite, "tasks": tasks})
    with pytest.raises(NotComparable) as caught:
        compare(a, b)
    assert "task t2: content differs" in caught.value.differences


def test_what_may_differ_is_shown_not_refused(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", large_attempts())
    base = manifest_of()
    tool = {**base["tool"], "version": "0.2.0"}
    candidates = {"coder-large": {"listed": True, "config_version": "beef"}}
    b = write_run(tmp_path / "b", large_attempts(), tool=tool, candidates=candidates,
                  finished_at=None)  # fmt: skip
    text = compare(a, b)
    assert "- tool version: 0.1.0 (A), 0.2.0 (B)" in text
    assert "- candidate coder-large: config version c0ffee (A), beef (B)" in text
    assert "- candidate coder-small: only in run A" in text
    assert "| finished | 2026-12-01T10:05:00Z | **incomplete run** |" in text
