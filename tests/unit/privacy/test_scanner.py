"""Findings without overlaps, and typed placeholders (gateway.privacy.scanner)."""

from __future__ import annotations

from gateway.privacy.patterns import PERSONAL, SECRETS, host_detector
from gateway.privacy.scanner import Masker, Scanner

HOSTS = host_detector(("corp.example.com", ".internal"))
assert HOSTS is not None
SCANNER = Scanner([*SECRETS, *PERSONAL, HOSTS])


def test_an_overlap_keeps_the_first_start_then_the_first_detector() -> None:
    # The e-mail pattern would take `s3cret@db...`; the URL password comes first.
    url = "postgres://app:s3cret@db.corp.example.com/app"
    found = [(f.category, url[f.start : f.end]) for f in SCANNER.find(url)]
    assert found == [("password", "s3cret"), ("host", "db.corp.example.com")]


def test_a_card_number_is_not_also_a_phone_number() -> None:
    assert [f.category for f in SCANNER.find("4111 1111 1111 1111")] == ["card"]


def test_placeholders_are_typed_numbered_and_consistent_within_a_request() -> None:
    masker = Masker()
    first = "From a@example.com to b@example.com, key sk-abcdef123456"
    second = "Reply to a@example.com; key sk-abcdef123456 again"
    assert masker.mask(first, SCANNER.find(first)) == (
        "From [EMAIL_1] to [EMAIL_2], key [API_KEY_1]"
    )
    assert masker.mask(second, SCANNER.find(second)) == "Reply to [EMAIL_1]; key [API_KEY_1] again"
    assert masker.counts == {"email": 3, "api_key": 2}


def test_a_key_value_secret_keeps_its_key_and_quotes() -> None:
    text = '{"password": "a b c", "user": "bob"}'
    assert Masker().mask(text, SCANNER.find(text)) == '{"password": "[PASSWORD_1]", "user": "bob"}'
    url = "postgres://app:s3cret@db.corp.example.com/app"
    assert Masker().mask(url, SCANNER.find(url)) == "postgres://app:[PASSWORD_1]@[HOST_1]/app"
