"""Per-candidate figures of a run, and one weighted score per candidate under a team profile.

The figures follow the dimensions of `gateway eval` (docs/eval.md):

- correctness: the share of attempts whose solution passed the hidden tests;
- context understanding: the same share over the cross-file tasks only;
- speed: time to first token and to the complete answer, p50 and p95, over the attempts
  that got an answer;
- unit cost: the average cost of a *completed* task: every attempt's tokens at the
  candidate's price, plus the manifest's `manual_correction` for each attempt that did
  not pass (a person completed that task); None when the candidate has no price;
- stability: the share of attempts that ended on an upstream error, and the share of
  requests that a rate limit or overload refused (429, 503).

Attempts at a malformed task (reason `task: ...`) say nothing about the candidate: they
are left out of every figure and only counted.

A profile (evals/profiles/<name>.yaml) turns the figures into one score: each dimension
becomes a 0..1 score (rates as they are, speed and cost through the profile's scales,
security and integration from the reviewer's record) and the scores are weighted. A
dimension without data (not reviewed, no price, not measured) cannot be scored: its
weight is dropped and the others renormalized, and the score says which were dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gateway_tools.eval.records import Attempt
from gateway_tools.eval.reviews import Review
from gateway_tools.eval.yaml_files import load_yaml

DIMENSIONS = (
    "correctness",
    "context",
    "speed",
    "cost",
    "stability",
    "security",
    "integration",
)
CROSS_FILE = "cross-file"
MALFORMED_PREFIX = "task:"
UPSTREAM_PREFIX = "upstream:"
TOOL_PREFIX = "tool:"  # a coding tool's run went wrong: not installed, stopped, exited
# The figures a profile's scales may turn into a speed or a cost score.
SPEED_SCALES = ("ttft_p50_s", "ttft_p95_s", "total_p50_s", "total_p95_s")
COST_SCALES = ("cost_per_task",)
WEIGHT_TOLERANCE = 0.001


@dataclass(frozen=True, slots=True)
class Rate:
    """`hits` out of `total`; its value is None when there is nothing to count."""

    hits: int
    total: int

    @property
    def value(self) -> float | None:
        return self.hits / self.total if self.total else None


@dataclass(frozen=True, slots=True)
class Figures:
    """One candidate's measured figures in one run."""

    candidate: str
    attempts: int  # judged attempts: those at malformed tasks left out
    malformed: int  # attempts at malformed tasks (in no figure)
    correctness: Rate
    context: Rate  # cross-file tasks only
    by_category: dict[str, Rate]
    by_task: dict[str, Rate]
    expected_files: Rate  # answers that touched exactly the task's expected files
    answered: int  # attempts that got an answer (a first token)
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    total_p50_s: float | None
    total_p95_s: float | None
    priced: bool
    cost_per_task: float | None  # tokens plus manual correction, per attempt
    token_cost: float | None  # all tokens of all attempts, retries included
    token_cost_per_pass: float | None
    tokens_in: int
    tokens_out: int
    cached_tokens: int  # of tokens_in: prompt tokens the server had cached
    calls: int  # model calls the gateway recorded (requests sent), retries included
    errors: Rate  # attempts that ended on an upstream error
    refusals: Rate  # requests refused with 429 or 503, of all requests sent
    retries: int
    status_5xx: int
    connection_errors: int
    fallbacks: int  # attempts the gateway answered from a fallback model
    # A coding tool's runs (`--tool`) that went wrong, of its runs: none for a model.
    tool_failures: Rate = Rate(0, 0)
    reasons: dict[str, int] = field(default_factory=dict)  # why attempts failed, counted

    @property
    def stability(self) -> float | None:
        """1 - error rate - refusal share, clamped to 0..1; None when nothing was measured."""
        if self.errors.value is None:
            return None
        return _clamp(1.0 - self.errors.value - (self.refusals.value or 0.0))


def is_malformed(attempt: Attempt) -> bool:
    """An attempt at a task that could not be judged (the task's fault, not the candidate's)."""
    return (attempt.reason or "").startswith(MALFORMED_PREFIX)


def figures(attempts: list[Attempt], manifest: dict[str, Any]) -> dict[str, Figures]:
    """Every candidate's figures: the manifest's candidates first, in its order (those with
    no attempt yet included, with empty figures), then any other candidate in the attempts."""
    groups: dict[str, list[Attempt]] = {name: [] for name in manifest.get("candidates") or {}}
    for attempt in attempts:
        groups.setdefault(attempt.candidate, []).append(attempt)
    return {name: candidate_figures(name, group, manifest) for name, group in groups.items()}


def candidate_figures(candidate: str, attempts: list[Attempt], manifest: dict[str, Any]) -> Figures:
    """One candidate's figures from its attempts (the manifest gives prices)."""
    judged = [a for a in attempts if not is_malformed(a)]
    answered = [a for a in judged if a.ttft_s is not None]
    ttfts = [a.ttft_s for a in answered if a.ttft_s is not None]
    totals = [a.total_s for a in answered if a.total_s is not None]
    costs = _token_costs(_priced_as(candidate, manifest), judged, manifest)
    passes = sum(a.passed for a in judged)
    sent = sum(a.requests.sent for a in judged)
    token_cost = sum(costs) if costs is not None else None
    return Figures(
        candidate=candidate,
        attempts=len(judged),
        malformed=len(attempts) - len(judged),
        correctness=Rate(passes, len(judged)),
        context=_pass_rate([a for a in judged if a.category == CROSS_FILE]),
        by_category=_pass_rates(judged, lambda a: a.category),
        by_task=_pass_rates(judged, lambda a: a.task),
        expected_files=Rate(
            sum(a.expected_files_touched for a in judged if _left_files(a)),
            sum(_left_files(a) for a in judged),
        ),
        answered=len(answered),
        ttft_p50_s=percentile(ttfts, 50),
        ttft_p95_s=percentile(ttfts, 95),
        total_p50_s=percentile(totals, 50),
        total_p95_s=percentile(totals, 95),
        priced=costs is not None,
        cost_per_task=_cost_per_task(judged, costs, _manual_correction(manifest)),
        token_cost=token_cost,
        token_cost_per_pass=token_cost / passes if token_cost is not None and passes else None,
        tokens_in=sum(a.tokens_in for a in judged),
        tokens_out=sum(a.tokens_out for a in judged),
        cached_tokens=sum(a.cached_tokens for a in judged),
        calls=sent,
        errors=Rate(sum((a.reason or "").startswith(UPSTREAM_PREFIX) for a in judged), len(judged)),
        refusals=Rate(sum(a.requests.refusals for a in judged), sent),
        retries=sum(a.requests.retries for a in judged),
        status_5xx=sum(a.requests.status_5xx for a in judged),
        connection_errors=sum(a.requests.connection_errors for a in judged),
        fallbacks=sum(a.fallback is not None for a in judged),
        tool_failures=Rate(
            sum((a.reason or "").startswith(TOOL_PREFIX) for a in judged if a.tool),
            sum(a.tool is not None for a in judged),
        ),
        reasons=_reasons(attempts),
    )


def _priced_as(candidate: str, manifest: dict[str, Any]) -> str:
    """The model whose price a candidate pays: a tool's candidate ("tool/model") its
    model's."""
    info = (manifest.get("candidates") or {}).get(candidate)
    model = info.get("model") if isinstance(info, dict) else None
    return str(model) if model else candidate


def _left_files(attempt: Attempt) -> bool:
    """Whether the attempt left files to judge: an answer that applied, or a tool's run
    whose directory the hidden tests ran on."""
    return attempt.answer_form is not None or (
        attempt.tool is not None and attempt.tests_s is not None
    )


def percentile(values: list[float], p: float) -> float | None:
    """The p-th percentile, interpolated linearly between the closest ranks (numpy's
    default); None for no values."""
    return float(np.percentile(values, p)) if values else None


def _pass_rate(attempts: list[Attempt]) -> Rate:
    return Rate(sum(a.passed for a in attempts), len(attempts))


def _pass_rates(attempts: list[Attempt], key: Callable[[Attempt], str]) -> dict[str, Rate]:
    groups: dict[str, list[Attempt]] = {}
    for attempt in attempts:
        groups.setdefault(key(attempt), []).append(attempt)
    return {name: _pass_rate(groups[name]) for name in sorted(groups)}


def _reasons(attempts: list[Attempt]) -> dict[str, int]:
    """Why attempts failed, most frequent first (malformed tasks included: they are listed)."""
    counts: dict[str, int] = {}
    for attempt in attempts:
        if not attempt.passed:
            reason = attempt.reason or "no reason recorded"
            counts[reason] = counts.get(reason, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def _token_costs(
    model: str, attempts: list[Attempt], manifest: dict[str, Any]
) -> list[float] | None:
    """Each attempt's token cost, or None when `model` has no price.

    An attempt that sent no request (its task blocked by the outbound policy) cost no
    tokens, so its missing cost is zero; any other missing cost means no price.
    """
    models = (manifest.get("prices") or {}).get("models")
    if isinstance(models, dict) and model not in models:
        return None
    costs = []
    for attempt in attempts:
        if attempt.cost is not None:
            costs.append(attempt.cost)
        elif attempt.requests.sent == 0:
            costs.append(0.0)
        else:
            return None
    return costs


def _manual_correction(manifest: dict[str, Any]) -> float:
    return float((manifest.get("prices") or {}).get("manual_correction", 0.0))


def _cost_per_task(
    attempts: list[Attempt], costs: list[float] | None, correction: float
) -> float | None:
    if costs is None or not attempts:
        return None
    pairs = zip(attempts, costs, strict=True)
    total = sum(cost + (0.0 if a.passed else correction) for a, cost in pairs)
    return total / len(attempts)


def _clamp(value: float) -> float:
    return max(0.0, min(1.0, value))


# --- profiles and weighted scores ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Scale:
    """A raw figure to a 0..1 score: 1 at `good`, 0 at `bad`, linear between, clamped."""

    good: float
    bad: float

    def score(self, value: float) -> float:
        return _clamp((value - self.bad) / (self.good - self.bad))


@dataclass(frozen=True, slots=True)
class Profile:
    """A team's weights over the dimensions (summing to 1) and its scales."""

    name: str
    description: str
    weights: dict[str, float]
    scales: dict[str, Scale]
    path: Path | None = None


@dataclass(frozen=True, slots=True)
class WeightedScore:
    """One candidate's score under one profile, and how it was made."""

    profile: str
    value: float | None  # None when no dimension could be scored
    scores: dict[str, float]  # each scored dimension, 0..1
    weights: dict[str, float]  # the weights used: renormalized over the scored dimensions
    dropped: dict[str, str]  # dimension (with a weight) -> why it could not be scored


def load_profile(path: Path) -> Profile:
    """Load and check a profile; ValueError (`file: why`) when it is not a valid one."""
    return load_yaml(path, "profile", _profile)


def _profile(data: Any, path: Path) -> Profile:
    if not isinstance(data, dict):
        raise TypeError("expected a mapping with name, weights and scales")
    unknown = set(data) - {"name", "description", "weights", "scales"}
    if unknown:
        raise ValueError(f"unknown keys: {', '.join(sorted(map(str, unknown)))}")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("`name` must be a non-empty string")
    weights = _weights(data.get("weights"))
    scales = _scales(data.get("scales") or {})
    if weights.get("speed", 0.0) > 0 and not set(SPEED_SCALES) & set(scales):
        raise ValueError(f"speed has a weight but no scale (one of {', '.join(SPEED_SCALES)})")
    if weights.get("cost", 0.0) > 0 and not set(COST_SCALES) & set(scales):
        raise ValueError("cost has a weight but no scale (cost_per_task)")
    return Profile(name, str(data.get("description") or ""), weights, scales, path)


def _weights(data: Any) -> dict[str, float]:
    if not isinstance(data, dict) or not data:
        raise TypeError(f"`weights` must be a mapping of {', '.join(DIMENSIONS)}")
    unknown = set(data) - set(DIMENSIONS)
    if unknown:
        raise ValueError(f"unknown dimensions in weights: {', '.join(sorted(map(str, unknown)))}")
    weights = {}
    for dimension in DIMENSIONS:
        value = data.get(dimension, 0.0)
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ValueError(f"weight of {dimension} must be a number >= 0, not {value!r}")
        weights[dimension] = float(value)
    total = sum(weights.values())
    if abs(total - 1.0) > WEIGHT_TOLERANCE:
        raise ValueError(f"weights sum to {total:g}, not 1")
    return weights


def _scales(data: Any) -> dict[str, Scale]:
    if not isinstance(data, dict):
        raise TypeError("`scales` must be a mapping of figure: {good, bad}")
    scales = {}
    for key, value in data.items():
        if key not in SPEED_SCALES + COST_SCALES:
            known = ", ".join(SPEED_SCALES + COST_SCALES)
            raise ValueError(f"unknown scale {key!r} (one of {known})")
        if not isinstance(value, dict) or set(value) != {"good", "bad"}:
            raise ValueError(f"scale {key} must be {{good: number, bad: number}}")
        good, bad = value["good"], value["bad"]
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (good, bad)):
            raise ValueError(f"scale {key}: good and bad must be numbers")
        if good == bad:
            raise ValueError(f"scale {key}: good and bad must differ")
        scales[key] = Scale(float(good), float(bad))
    return scales


def dimension_scores(
    figures: Figures, profile: Profile, review: Review | None
) -> tuple[dict[str, float], dict[str, str]]:
    """Each dimension's 0..1 score under the profile's scales, and why the others have none."""
    scores: dict[str, float] = {}
    missing: dict[str, str] = {}

    def put(dimension: str, value: float | None, why: str) -> None:
        if value is None:
            missing[dimension] = why
        else:
            scores[dimension] = value

    put("correctness", figures.correctness.value, "not measured (no judged attempt)")
    put("context", figures.context.value, "not measured (no cross-file attempt)")
    put("speed", _speed_score(figures, profile), "not measured (no answer)")
    cost_scale = profile.scales.get("cost_per_task")
    put(
        "cost",
        cost_scale.score(figures.cost_per_task)
        if cost_scale is not None and figures.cost_per_task is not None
        else None,
        "no price" if not figures.priced else "not measured (no judged attempt)",
    )
    put("stability", figures.stability, "not measured (no judged attempt)")
    security = review.data_security if review is not None else None
    put("security", security.score / 5.0 if security is not None else None, "not reviewed")
    integration = review.integration if review is not None else None
    put("integration", integration.score / 5.0 if integration is not None else None, "not reviewed")
    return scores, missing


def _speed_score(figures: Figures, profile: Profile) -> float | None:
    """The mean score of the profile's speed scales over the figures that were measured."""
    parts = []
    for key in SPEED_SCALES:
        scale, value = profile.scales.get(key), getattr(figures, key)
        if scale is not None and value is not None:
            parts.append(scale.score(value))
    return sum(parts) / len(parts) if parts else None


def weighted_score(figures: Figures, profile: Profile, review: Review | None) -> WeightedScore:
    """The candidate's score under the profile: the weighted mean of its dimension scores,
    the weights of dimensions without a score dropped and the rest renormalized to 1."""
    scores, missing = dimension_scores(figures, profile, review)
    weighted = {d: w for d, w in profile.weights.items() if w > 0}
    dropped = {d: missing[d] for d in weighted if d in missing}
    kept = {d: w for d, w in weighted.items() if d not in dropped}
    total = sum(kept.values())
    if total <= 0:
        return WeightedScore(profile.name, None, {}, {}, dropped)
    weights = {d: w / total for d, w in kept.items()}
    value = sum(weights[d] * scores[d] for d in weights)
    return WeightedScore(profile.name, value, {d: scores[d] for d in weights}, weights, dropped)
