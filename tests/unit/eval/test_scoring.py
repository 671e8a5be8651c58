"""Per-candidate figures and weighted scores, computed exactly from hand-made attempts.

The helpers at the top (`attempt`, `manifest_of`, `write_run`) build run records by hand;
the report and compare tests use them too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway_tools.eval import manifest, records
from gateway_tools.eval.records import Attempt, Requests
from gateway_tools.eval.reviews import DataSecurity, Integration, Review
from gateway_tools.eval.scoring import (
    Figures,
    Profile,
    Rate,
    figures,
    load_profile,
    percentile,
    weighted_score,
)

REPO = Path(__file__).resolve().parents[3]
PROFILES = REPO / "evals" / "profiles"


def attempt(candidate: str, task: str, category: str, passed: bool, **values: Any) -> Attempt:
    """An attempt as the runner records it (attempt index 0 unless given)."""
    values.setdefault("attempt", 0)
    return Attempt(candidate=candidate, task=task, category=category, passed=passed, **values)


def task_record(digit: str, category: str, problem: str | None = None) -> dict[str, Any]:
    """A task as the manifest records it (`problem` set for a malformed task)."""
    return {"digest": digit * 64, "category": category, "kind": "bug", "problem": problem}


def manifest_of(**changes: Any) -> dict[str, Any]:
    """A manifest of the shape `manifest.build` writes, for a run of two candidates of which
    only coder-large has a price; `changes` replace top-level parts."""
    base: dict[str, Any] = {
        "format_version": manifest.FORMAT_VERSION,
        "suite": {
            "name": "gateway-python",
            "version": 1,
            "path": "evals/suites/gateway-python",
            "digest": "a" * 64,
            "tasks": {
                "t1": task_record("1", "single-file"),
                "t2": task_record("2", "cross-file"),
                "t3": task_record("3", "cross-file"),
                "t4": task_record("4", "single-file"),
                "t5": task_record("5", "single-file", problem="no tests"),
            },
        },
        "template": {"name": "code-change", "version": "1", "digest": "b" * 64},
        "settings": {
            "sampling": {"temperature": 0.0, "max_tokens": 2048, "seed": 1},
            "attempts": 1,
            "api": "chat",
            "max_retries": 4,
            "concurrency": 4,
            "sandbox": {"wall_s": 60.0},
        },
        "outbound": {
            "applied_by": "gateway eval",
            "policy": "mask",
            "internal_domains": ["corp.example"],
        },
        "candidates": {
            "coder-large": {"listed": True, "config_version": "c0ffee"},
            "coder-small": {"listed": True, "config_version": "c0ffee"},
        },
        "prices": {
            "currency": "USD",
            "manual_correction": 20.0,
            "models": {"coder-large": {"input_per_million": 3.0, "output_per_million": 15.0}},
        },
        "tool": {
            "name": "gateway eval",
            "version": "0.1.0",
            "git_commit": "deadbeef",
            "python": "3.11.2",
            "os": "Linux",
        },
        "started_at": "2026-12-01T10:00:00Z",
        "finished_at": "2026-12-01T10:05:00Z",
        "resumed_at": [],
    }
    return {**base, **changes}


def large_attempts() -> list[Attempt]:
    """coder-large: 2 of 4 judged attempts pass, one upstream error, one malformed task."""
    return [
        attempt("coder-large", "t1", "single-file", True, cost=0.10, ttft_s=1.0, total_s=4.0,
                requests=Requests(sent=1)),
        attempt("coder-large", "t2", "cross-file", False, reason="tests failed", cost=0.20,
                ttft_s=2.0, total_s=6.0, requests=Requests(sent=1)),
        attempt("coder-large", "t3", "cross-file", True, cost=0.30, ttft_s=3.0, total_s=8.0,
                requests=Requests(sent=3, retries=2, status_429=1, status_503=1, status_5xx=1)),
        attempt("coder-large", "t4", "single-file", False, reason="upstream: HTTP 503",
                cost=0.0, total_s=5.0,
                requests=Requests(sent=5, retries=4, status_503=5, status_5xx=5)),
        attempt("coder-large", "t5", "single-file", False, reason="task: no tests"),
    ]  # fmt: skip


def small_attempts() -> list[Attempt]:
    """coder-small (no price): 3 of 4 pass, answers at 0.5 s to first token."""
    return [
        attempt("coder-small", task, category, task != "t4", ttft_s=0.5, total_s=2.0,
                reason=None if task != "t4" else "answer: neither files nor a diff",
                requests=Requests(sent=1), tokens_in=100, tokens_out=50)
        for task, category in (("t1", "single-file"), ("t2", "cross-file"),
                               ("t3", "cross-file"), ("t4", "single-file"))
    ]  # fmt: skip


def write_run(directory: Path, attempts: list[Attempt], **changes: Any) -> Path:
    """A run directory as `gateway eval run` leaves it."""
    directory.mkdir(parents=True, exist_ok=True)
    records.write_manifest(directory, manifest_of(**changes))
    log = records.AttemptLog(directory)
    for one in attempts:
        log.append(one)
    return directory


def write_profile(path: Path, weights: dict[str, float], **scales: dict[str, float]) -> Path:
    lines = [f'name: "{path.stem}"', "weights:"]
    lines += [f"  {d}: {w}" for d, w in weights.items()]
    if scales:
        lines.append("scales:")
        lines += [f"  {k}: {{good: {v['good']}, bad: {v['bad']}}}" for k, v in scales.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


WEIGHTS = {"correctness": 0.25, "context": 0.15, "speed": 0.1, "cost": 0.1, "stability": 0.1,
           "security": 0.25, "integration": 0.05}  # fmt: skip
SCALES = {"ttft_p50_s": {"good": 1.0, "bad": 21.0}, "cost_per_task": {"good": 0.0, "bad": 20.0}}


def profile_in(tmp_path: Path) -> Profile:
    return load_profile(write_profile(tmp_path / "test.yaml", WEIGHTS, **SCALES))


def review(candidate: str, security: float = 4, integration: float = 3) -> Review:
    import datetime

    return Review(
        candidate=candidate,
        reviewer="platform-team",
        reviewed_on=datetime.date(2026, 11, 30),
        data_security=DataSecurity("none", "TLS 1.3", ("SOC 2 Type II",), security,
                                   ("https://example.com/security",)),
        integration=Integration("VS Code", "git", "GitHub Actions", integration,
                                ("docs/eval.md",)),
    )  # fmt: skip


def large() -> Figures:
    return figures(large_attempts(), manifest_of())["coder-large"]


# --- figures ------------------------------------------------------------------------------


def test_pass_rates_leave_out_malformed_tasks_and_count_them() -> None:
    f = large()
    assert f.attempts == 4 and f.malformed == 1
    assert f.correctness == Rate(2, 4) and f.correctness.value == 0.5
    assert f.context == Rate(1, 2)
    assert f.by_category == {"cross-file": Rate(1, 2), "single-file": Rate(1, 2)}
    assert f.by_task == {"t1": Rate(1, 1), "t2": Rate(0, 1), "t3": Rate(1, 1), "t4": Rate(0, 1)}
    assert "t5" not in f.by_task


def test_speed_is_measured_over_answered_attempts_only() -> None:
    f = large()
    assert f.answered == 3
    assert f.ttft_p50_s == pytest.approx(2.0)
    assert f.ttft_p95_s == pytest.approx(2.9)  # between 2 and 3, at 0.95 of the way
    # The upstream error's 5 s is not an answer's time: totals are 4, 6 and 8 s.
    assert f.total_p50_s == pytest.approx(6.0)
    assert f.total_p95_s == pytest.approx(7.8)


def test_unit_cost_adds_a_manual_correction_for_each_failed_attempt() -> None:
    f = large()
    # (0.10 + (0.20 + 20) + 0.30 + (0.00 + 20)) / 4 judged attempts.
    assert f.priced
    assert f.cost_per_task == pytest.approx(10.15)
    assert f.token_cost == pytest.approx(0.60)
    assert f.token_cost_per_pass == pytest.approx(0.30)


def test_a_candidate_without_a_price_has_no_cost() -> None:
    f = figures(small_attempts(), manifest_of())["coder-small"]
    assert not f.priced
    assert f.cost_per_task is None and f.token_cost is None and f.token_cost_per_pass is None


def test_an_attempt_with_cost_none_means_no_price_when_the_manifest_lists_none() -> None:
    priced = attempt("m", "t1", "single-file", True, cost=0.5, requests=Requests(sent=1))
    unpriced = attempt("m", "t2", "single-file", True, cost=None, requests=Requests(sent=1))
    f = figures([priced, unpriced], manifest_of(prices={}))["m"]
    assert not f.priced and f.cost_per_task is None


def test_a_blocked_attempt_sent_nothing_and_costs_only_its_correction() -> None:
    attempts = [
        attempt("coder-large", "t1", "single-file", True, cost=1.0, requests=Requests(sent=1)),
        attempt("coder-large", "t2", "cross-file", False, reason="blocked: the task holds email"),
    ]
    f = figures(attempts, manifest_of())["coder-large"]
    assert f.priced
    assert f.cost_per_task == pytest.approx((1.0 + 20.0) / 2)


def test_stability_counts_upstream_errors_and_refused_requests() -> None:
    f = large()
    assert f.errors == Rate(1, 4)
    # 429 + 503 responses over every request sent: (1 + 1 + 5) / (1 + 1 + 3 + 5).
    assert f.refusals == Rate(7, 10)
    assert f.retries == 6 and f.status_5xx == 6
    assert f.stability == pytest.approx(1 - 0.25 - 0.7)


def test_stability_is_clamped_at_zero() -> None:
    attempts = [
        attempt("m", "t1", "single-file", False, reason="upstream: refused",
                requests=Requests(sent=2, status_429=2)),
    ]  # fmt: skip
    assert figures(attempts, manifest_of())["m"].stability == 0.0


def test_failure_reasons_are_counted_most_frequent_first() -> None:
    attempts = [
        *large_attempts(),
        attempt("coder-large", "t2", "cross-file", False, attempt=1, reason="tests failed"),
    ]
    assert figures(attempts, manifest_of())["coder-large"].reasons == {
        "tests failed": 2,
        "task: no tests": 1,
        "upstream: HTTP 503": 1,
    }


def test_manifest_candidates_come_first_even_without_attempts() -> None:
    found = figures(small_attempts(), manifest_of())
    assert list(found) == ["coder-large", "coder-small"]
    empty = found["coder-large"]
    assert empty.attempts == 0 and empty.correctness.value is None and empty.ttft_p50_s is None


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([], 50) is None
    assert percentile([7.0], 95) == 7.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == pytest.approx(2.5)
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 95) == pytest.approx(4.8)


# --- weighted scores ----------------------------------------------------------------------


def test_weighted_score_with_a_review(tmp_path: Path) -> None:
    score = weighted_score(large(), profile_in(tmp_path), review("coder-large"))
    assert score.dropped == {}
    assert score.scores == pytest.approx({
        "correctness": 0.5,
        "context": 0.5,
        "speed": 0.95,  # TTFT p50 2 s on 1 (good) .. 21 (bad)
        "cost": 1 - 10.15 / 20,
        "stability": 0.05,
        "security": 0.8,
        "integration": 0.6,
    })  # fmt: skip
    assert score.weights == pytest.approx(WEIGHTS)
    assert score.value == pytest.approx(
        0.25 * 0.5 + 0.15 * 0.5 + 0.1 * 0.95 + 0.1 * 0.4925 + 0.1 * 0.05 + 0.25 * 0.8 + 0.05 * 0.6
    )


def test_without_a_review_its_weights_are_dropped_and_the_rest_renormalized(
    tmp_path: Path,
) -> None:
    score = weighted_score(large(), profile_in(tmp_path), None)
    assert score.dropped == {"security": "not reviewed", "integration": "not reviewed"}
    assert score.weights == pytest.approx({
        "correctness": 0.25 / 0.7,
        "context": 0.15 / 0.7,
        "speed": 0.1 / 0.7,
        "cost": 0.1 / 0.7,
        "stability": 0.1 / 0.7,
    })  # fmt: skip
    assert sum(score.weights.values()) == pytest.approx(1.0)
    assert score.value == pytest.approx((0.125 + 0.075 + 0.095 + 0.04925 + 0.005) / 0.7)


def test_no_price_drops_the_cost_weight(tmp_path: Path) -> None:
    small = figures(small_attempts(), manifest_of())["coder-small"]
    score = weighted_score(small, profile_in(tmp_path), review("coder-small"))
    assert score.dropped == {"cost": "no price"}
    assert score.weights["correctness"] == pytest.approx(0.25 / 0.9)
    assert "cost" not in score.scores


def test_scales_clamp_beyond_good_and_bad(tmp_path: Path) -> None:
    profile = profile_in(tmp_path)
    fast = figures(small_attempts(), manifest_of())["coder-small"]  # TTFT 0.5 s: beyond good
    assert weighted_score(fast, profile, None).scores["speed"] == 1.0
    slow = figures(
        [attempt("m", "t1", "single-file", True, ttft_s=60.0, total_s=61.0)], manifest_of()
    )["m"]
    assert weighted_score(slow, profile, None).scores["speed"] == 0.0


# --- profiles -----------------------------------------------------------------------------


def test_weights_that_do_not_sum_to_one_are_refused_naming_the_file(tmp_path: Path) -> None:
    path = write_profile(tmp_path / "off.yaml", {**WEIGHTS, "correctness": 0.35}, **SCALES)
    with pytest.raises(ValueError, match=r"off\.yaml: weights sum to 1\.1, not 1"):
        load_profile(path)


def test_a_rounding_error_within_tolerance_is_accepted(tmp_path: Path) -> None:
    weights = {**WEIGHTS, "correctness": 0.2505}
    assert load_profile(write_profile(tmp_path / "near.yaml", weights, **SCALES)).name == "near"


@pytest.mark.parametrize(
    ("weights", "scales", "message"),
    [
        ({**WEIGHTS, "speeed": 0.0}, SCALES, "unknown dimensions in weights: speeed"),
        ({**WEIGHTS, "cost": -0.1, "correctness": 0.45}, SCALES, "weight of cost"),
        (WEIGHTS, {"cost_per_task": SCALES["cost_per_task"]}, "speed has a weight but no scale"),
        (WEIGHTS, {**SCALES, "latency": {"good": 1, "bad": 2}}, "unknown scale 'latency'"),
        (WEIGHTS, {**SCALES, "ttft_p50_s": {"good": 3, "bad": 3}}, "must differ"),
    ],
)
def test_bad_profiles_are_refused(
    tmp_path: Path, weights: dict[str, float], scales: dict[str, Any], message: str
) -> None:
    path = write_profile(tmp_path / "bad.yaml", weights, **scales)
    with pytest.raises(ValueError, match=r"bad\.yaml: ") as caught:
        load_profile(path)
    assert message in str(caught.value)


def test_a_profile_that_is_not_yaml_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("weights: [unclosed\n")
    with pytest.raises(ValueError, match=r"broken\.yaml"):
        load_profile(path)


def test_the_shipped_profiles_load_and_security_sensitive_weighs_security_higher() -> None:
    loaded = {p.stem: load_profile(p) for p in sorted(PROFILES.glob("*.yaml"))}
    assert set(loaded) == {"balanced", "security-sensitive", "cost-sensitive"}
    for name, profile in loaded.items():
        assert profile.name == name
        assert sum(profile.weights.values()) == pytest.approx(1.0, abs=0.001)
    security = loaded["security-sensitive"].weights["security"]
    assert security > loaded["balanced"].weights["security"]
    assert security > loaded["cost-sensitive"].weights["security"]
    cost = loaded["cost-sensitive"].weights["cost"]
    assert cost > loaded["balanced"].weights["cost"]
    assert cost > loaded["security-sensitive"].weights["cost"]
