"""Reviewer records: the shipped fixtures load, and a bad file is refused naming it and why."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from gateway_tools.eval.reviews import load_review, load_reviews

REVIEWS = Path(__file__).resolve().parents[3] / "evals" / "reviews"

GOOD = """\
candidate: coder-large
reviewer: platform-team
reviewed_on: 2026-11-30
data_security:
  retention: "prompts not stored; logs 30 days, redacted"
  encryption_in_transit: "TLS 1.3 to the gateway; mTLS gateway to Triton"
  certifications: [SOC 2 Type II]
  score: 4
  evidence: [https://example.com/security]
integration:
  editor: "VS Code"
  version_control: "git"
  ci: "GitHub Actions"
  score: 3
  evidence: [docs/eval.md]
"""


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text)
    return path


def test_a_record_loads_with_its_scores_and_evidence(tmp_path: Path) -> None:
    review = load_review(write(tmp_path, "coder-large.yaml", GOOD))
    assert review.candidate == "coder-large" and review.reviewer == "platform-team"
    assert review.reviewed_on == datetime.date(2026, 11, 30)
    assert review.data_security is not None and review.integration is not None
    assert review.data_security.score == 4.0
    assert review.data_security.certifications == ("SOC 2 Type II",)
    assert review.data_security.evidence == ("https://example.com/security",)
    assert review.integration.score == 3.0 and review.integration.ci == "GitHub Actions"


def test_a_record_of_one_section_leaves_the_other_not_reviewed(tmp_path: Path) -> None:
    text = GOOD.split("integration:")[0]
    review = load_review(write(tmp_path, "coder-large.yaml", text))
    assert review.data_security is not None and review.integration is None


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("  score: 4\n", "  score: 6\n", "data_security.score must be a number from 0 to 5"),
        ("  score: 3\n", "  score: yes\n", "integration.score must be a number"),
        ("  evidence: [docs/eval.md]\n", "  evidence: []\n", "integration.evidence must name"),
        ("  retention:", "  retension:", "unknown keys: data_security.retension"),
        ("reviewed_on: 2026-11-30", "reviewed_on: last week", "reviewed_on must be a date"),
        ("candidate: coder-large\n", "", "candidate must be a non-empty string"),
        ("  certifications: [SOC 2 Type II]", "  certifications: SOC 2", "certifications must"),
    ],
)
def test_a_bad_record_is_refused_naming_the_file_and_why(
    tmp_path: Path, old: str, new: str, message: str
) -> None:
    assert old in GOOD
    path = write(tmp_path, "bad.yaml", GOOD.replace(old, new))
    with pytest.raises(ValueError, match=r"bad\.yaml: ") as caught:
        load_review(path)
    assert message in str(caught.value)


def test_a_record_without_either_section_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "empty.yaml", "candidate: x\nreviewer: y\nreviewed_on: 2026-11-30\n")
    with pytest.raises(ValueError, match=r"empty\.yaml: neither data_security nor integration"):
        load_review(path)


def test_a_file_that_is_not_a_mapping_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"list\.yaml: the record must be a mapping"):
        load_review(write(tmp_path, "list.yaml", "- a\n- b\n"))
    with pytest.raises(ValueError, match=r"broken\.yaml:2: not valid YAML"):
        load_review(write(tmp_path, "broken.yaml", "candidate: [unclosed\n"))


def test_a_directory_with_two_records_of_one_candidate_is_refused(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", GOOD)
    write(tmp_path, "b.yml", GOOD)
    with pytest.raises(ValueError, match="a second record of coder-large"):
        load_reviews(tmp_path)


def test_a_missing_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a directory of reviewer records"):
        load_reviews(tmp_path / "nowhere")


def test_the_shipped_records_are_the_demo_candidates_and_say_they_are_fixtures() -> None:
    reviews = load_reviews(REVIEWS)
    assert set(reviews) == {"coder-large", "coder-small"}
    for name, review in reviews.items():
        assert review.data_security is not None and review.integration is not None
        assert review.data_security.evidence and review.integration.evidence
        assert review.path is not None
        assert review.path.read_text().startswith("# FIXTURE."), name
