"""`gateway eval report`: the Markdown and the charts, from a run directory made by hand."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gateway_tools.eval.reporting import (
    CATEGORY_CHART,
    COST_CHART,
    REPORT_DIR,
    REPORT_FILE,
    TTFT_CHART,
    write_report,
)
from tests.unit.eval.test_reviews import GOOD
from tests.unit.eval.test_scoring import (
    PROFILES,
    SCALES,
    WEIGHTS,
    large_attempts,
    manifest_of,
    small_attempts,
    write_profile,
    write_run,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def run(tmp_path: Path) -> Path:
    return write_run(tmp_path / "run", [*large_attempts(), *small_attempts()])


@pytest.fixture
def reviews(tmp_path: Path) -> Path:
    """A record of coder-large only (security 4/5, integration 3/5): coder-small has none."""
    directory = tmp_path / "reviews"
    directory.mkdir()
    (directory / "coder-large.yaml").write_text(GOOD)
    return directory


@pytest.fixture
def profile(tmp_path: Path) -> Path:
    return write_profile(tmp_path / "team.yaml", WEIGHTS, **SCALES)


def test_the_report_and_its_three_charts_are_written(
    run: Path, reviews: Path, profile: Path
) -> None:
    path = write_report(run, [profile], reviews)
    assert path == run / REPORT_DIR / REPORT_FILE and path.is_file()
    for chart in (COST_CHART, TTFT_CHART, CATEGORY_CHART):
        data = (run / REPORT_DIR / chart).read_bytes()
        assert data.startswith(PNG_MAGIC), chart
        assert len(data) > 1000, chart  # an image, not just a header
        assert f"]({chart})" in path.read_text()


def test_the_report_states_the_outbound_policy_and_the_run_header(
    run: Path, reviews: Path, profile: Path
) -> None:
    text = write_report(run, [profile], reviews).read_text()
    assert "| outbound sanitization | policy: mask (applied by gateway eval); internal domains: " \
           "corp.example |" in text  # fmt: skip
    assert "digest `aaaaaaaaaaaa`" in text and "digest `bbbbbbbbbbbb`" in text
    assert "| sampling | max_tokens=2048, seed=1, temperature=0.0 |" in text
    assert "| concurrency | 4 |" in text
    assert "commit `deadbeef`" in text
    assert "| finished | 2026-12-01T10:05:00Z |" in text
    assert "incomplete" not in text


def test_a_run_of_tools_says_the_tools_set_their_own_prompts_sampling_and_retries(
    tmp_path: Path, profile: Path
) -> None:
    settings = {**manifest_of()["settings"], "tool_sandbox": {"wall_s": 600.0},
                "tool_tenant": "evals", "tool_run_requests_per_minute": 120}  # fmt: skip
    run = write_run(tmp_path / "run", large_attempts(), settings=settings)
    text = write_report(run, [profile], None).read_text()
    own = "each tool's own (set by the tool, not by gateway eval)"
    for row in ("prompt template", "sampling", "API, retries"):
        assert f"| {row} | {own} |" in text
    assert "| coding tools' keys | tenant evals, one key a run, 120 requests a minute of its " \
           "own |" in text  # fmt: skip


def test_the_weighted_scores_stand_next_to_the_figures(
    run: Path, reviews: Path, profile: Path
) -> None:
    text = write_report(run, [profile, PROFILES / "balanced.yaml"], reviews).read_text()
    assert "| candidate | pass rate | cross-file | TTFT p50 | cost per task | stability | " \
           "security | integration | team | balanced |" in text  # fmt: skip
    # 0.57925 under `team` (test_scoring has the sum); coder-small, not reviewed and without
    # a price, is scored on the rest, renormalized: (0.25*0.75 + 0.15*1 + 0.1*1 + 0.1*1) / 0.6.
    assert (
        "| coder-large | 50.0 % | 50.0 % | 2.00 s | 10.15 USD | 5.0 % | 4/5 | 3/5 | 0.58 |" in text
    )
    assert "| coder-small | 75.0 % | 100.0 % | 0.50 s | no price | 100.0 % | not reviewed | " \
           "not reviewed | 0.90 |" in text  # fmt: skip
    assert (
        "- coder-small under team: left out cost: no price; security: not reviewed; "
        "integration: not reviewed. Weights used: correctness 0.417, context 0.250, "
        "speed 0.167, stability 0.167." in text
    )


def test_the_figures_table_has_units_and_says_no_price(run: Path, reviews: Path) -> None:
    text = write_report(run, [], reviews).read_text()
    assert "| correctness | pass rate | 50.0 % (2/4) | 75.0 % (3/4) |" in text
    assert "| speed | time to first token, p95 | 2.90 s | 0.50 s |" in text
    assert (
        "| cost | cost per completed task (with manual corrections) | 10.15 USD | no price |"
        in text
    )
    assert (
        "| stability | refusals (429 and 503, of requests sent) | 70.0 % (7/10) | 0.0 % (0/4) |"
        in text
    )
    assert "No profile was given: no weighted score." in text


def test_per_task_failures_and_not_measured(run: Path, reviews: Path, profile: Path) -> None:
    text = write_report(run, [profile], reviews).read_text()
    assert "| t2 | cross-file | 0/1 | 1/1 |" in text
    assert "| t5 | single-file | malformed task | - |" in text
    assert "- **1**: upstream: HTTP 503" in text
    assert "- **1**: answer: neither files nor a diff" in text
    assert "- coder-small: unit cost (no price for this candidate), data security (not " \
           "reviewed), integration (not reviewed)" in text  # fmt: skip


def test_reviewer_records_are_shown_with_their_evidence(
    run: Path, reviews: Path, profile: Path
) -> None:
    text = write_report(run, [profile], reviews).read_text()
    assert "- retention: prompts not stored; logs 30 days, redacted" in text
    assert "- evidence: <https://example.com/security>" in text
    assert "- evidence: `docs/eval.md`" in text
    assert "### coder-small\n\nnot reviewed: no record of this candidate." in text


def test_without_a_reviews_directory_the_report_says_so(run: Path, profile: Path) -> None:
    text = write_report(run, [profile], None).read_text()
    assert "No reviewer records: no directory of reviewer records was given." in text
    text = write_report(run, [profile], run / "no-such-dir").read_text()
    assert "does not exist" in text


def test_an_unfinished_run_is_reported_incomplete(tmp_path: Path, profile: Path) -> None:
    run = write_run(tmp_path / "run", large_attempts(), finished_at=None)
    text = write_report(run, [profile], None).read_text()
    assert "**This run is incomplete**" in text
    assert "| finished | not finished (incomplete run) |" in text


def test_a_run_without_attempts_is_reported_as_not_measured(tmp_path: Path, profile: Path) -> None:
    run = write_run(tmp_path / "run", [], finished_at=None)
    path = write_report(run, [profile], None)
    text = path.read_text()
    assert "- coder-large: correctness (no judged attempt), context understanding" in text
    assert "| coder-large | not measured | not measured | not measured |" in text
    assert (run / REPORT_DIR / TTFT_CHART).read_bytes().startswith(PNG_MAGIC)


def test_a_bad_profile_stops_the_report_naming_the_file(run: Path, tmp_path: Path) -> None:
    bad = write_profile(tmp_path / "bad.yaml", {**WEIGHTS, "security": 0.5}, **SCALES)
    with pytest.raises(ValueError, match=r"bad\.yaml: weights sum to"):
        write_report(run, [bad], None)


def test_importing_the_report_does_not_load_matplotlib() -> None:
    # The gateway imports gateway_tools.eval at start; matplotlib is a dev dependency.
    code = "import sys, gateway_tools.eval.compare; print('matplotlib' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"
