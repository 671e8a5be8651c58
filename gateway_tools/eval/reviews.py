"""Reviewer records: what no program can measure, recorded by a person with evidence.

Data security (retention, encryption in transit, certifications) and integration (editor,
version control, CI) are judged by a reviewer and written down, one YAML file per
candidate in a directory (evals/reviews/<candidate>.yaml):

    candidate: coder-large
    reviewer: platform-team
    reviewed_on: 2026-11-30
    data_security:
      retention: "prompts not stored; logs 30 days, redacted"
      encryption_in_transit: "TLS 1.3 to the gateway; mTLS gateway to Triton"
      certifications: [SOC 2 Type II]
      score: 4          # 0..5
      evidence: [https://example.com/...]
    integration:
      editor: "..."
      version_control: "..."
      ci: "..."
      score: 3
      evidence: [...]

A record may hold only one of the two sections: the other dimension is then "not
reviewed", as it is for a candidate without a record. Every score cites its evidence.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway_tools.eval.yaml_files import load_yaml

MAX_SCORE = 5


@dataclass(frozen=True, slots=True)
class DataSecurity:
    """How the candidate treats the data sent to it."""

    retention: str
    encryption_in_transit: str
    certifications: tuple[str, ...]
    score: float  # 0..5
    evidence: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Integration:
    """How the candidate fits the team's tools."""

    editor: str
    version_control: str
    ci: str
    score: float  # 0..5
    evidence: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Review:
    """One reviewer's record of one candidate."""

    candidate: str
    reviewer: str
    reviewed_on: datetime.date
    data_security: DataSecurity | None
    integration: Integration | None
    path: Path | None = None


def load_review(path: Path) -> Review:
    """Load and check one record; ValueError (`file: why`) when it is not a valid one."""
    return load_yaml(path, "review", _review)


def load_reviews(directory: Path) -> dict[str, Review]:
    """Every record in a directory (*.yaml, *.yml), by candidate; ValueError on a bad file,
    on two records of one candidate, or when the directory does not exist."""
    if not directory.is_dir():
        raise ValueError(f"{directory}: not a directory of reviewer records")
    reviews: dict[str, Review] = {}
    for path in sorted([*directory.glob("*.yaml"), *directory.glob("*.yml")]):
        review = load_review(path)
        earlier = reviews.get(review.candidate)
        if earlier is not None:
            raise ValueError(f"{path}: a second record of {review.candidate} (also {earlier.path})")
        reviews[review.candidate] = review
    return reviews


def _review(data: Any, path: Path) -> Review:
    section = _mapping(data, "the record")
    _only(section, {"candidate", "reviewer", "reviewed_on", "data_security", "integration"}, "")
    security = section.get("data_security")
    integration = section.get("integration")
    if security is None and integration is None:
        raise ValueError("neither data_security nor integration is recorded")
    return Review(
        candidate=_text(section, "candidate"),
        reviewer=_text(section, "reviewer"),
        reviewed_on=_date(section.get("reviewed_on")),
        data_security=_data_security(security) if security is not None else None,
        integration=_integration(integration) if integration is not None else None,
        path=path,
    )


def _data_security(data: Any) -> DataSecurity:
    section = _mapping(data, "data_security")
    where = "data_security."
    keys = {"retention", "encryption_in_transit", "certifications", "score", "evidence"}
    _only(section, keys, where)
    return DataSecurity(
        retention=_text(section, "retention", where),
        encryption_in_transit=_text(section, "encryption_in_transit", where),
        certifications=_texts(section, "certifications", where, allow_empty=True),
        score=_score(section, where),
        evidence=_texts(section, "evidence", where),
    )


def _integration(data: Any) -> Integration:
    section = _mapping(data, "integration")
    where = "integration."
    _only(section, {"editor", "version_control", "ci", "score", "evidence"}, where)
    return Integration(
        editor=_text(section, "editor", where),
        version_control=_text(section, "version_control", where),
        ci=_text(section, "ci", where),
        score=_score(section, where),
        evidence=_texts(section, "evidence", where),
    )


def _mapping(data: Any, what: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise TypeError(f"{what} must be a mapping")
    return data


def _only(section: dict[str, Any], allowed: set[str], where: str) -> None:
    # A misspelt key would otherwise pass silently and leave its field missing.
    unknown = sorted(str(key) for key in set(section) - allowed)
    if unknown:
        raise ValueError(f"unknown keys: {', '.join(where + key for key in unknown)}")


def _text(section: dict[str, Any], key: str, where: str = "") -> str:
    value = section.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}{key} must be a non-empty string")
    return value.strip()


def _texts(
    section: dict[str, Any], key: str, where: str, *, allow_empty: bool = False
) -> tuple[str, ...]:
    value = section.get(key)
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ValueError(f"{where}{key} must be a list of strings")
    if not value and not allow_empty:
        raise ValueError(f"{where}{key} must name at least one source")
    return tuple(v.strip() for v in value)


def _score(section: dict[str, Any], where: str) -> float:
    value = section.get("score")
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_SCORE:
        raise ValueError(f"{where}score must be a number from 0 to {MAX_SCORE}, not {value!r}")
    return float(value)


def _date(value: Any) -> datetime.date:
    # YAML reads an unquoted 2026-11-30 as a date already; a quoted one is text.
    if isinstance(value, datetime.datetime):
        return value.date()
    if isinstance(value, datetime.date):
        return value
    if isinstance(value, str):
        try:
            return datetime.date.fromisoformat(value)
        except ValueError:
            pass
    raise ValueError(f"reviewed_on must be a date (YYYY-MM-DD), not {value!r}")
