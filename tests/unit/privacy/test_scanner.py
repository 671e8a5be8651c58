"""Findings without overlaps, and typed placeholders (gateway.privacy.scanner)."""

from __future__ import annotations

import base64
import hashlib

import pytest

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


AWS = "AKIAIOSFODNN7EXAMPLE"
FULLWIDTH_CARD = "\u3000".join(["\uff14\uff11\uff11\uff11"] + ["\uff11\uff11\uff11\uff11"] * 3)
RUSSIAN = "\u041f\u0440\u0438\u0432\u0435\u0442, \u043a\u0430\u043a \u0434\u0435\u043b\u0430?"
GREEK = "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac."
JAPANESE = "\u4eca\u65e5\u306f\u3002\uff08\u6ce8\uff09\uff01"
EMOJI = "\U0001f44b\U0001f3fd \U0001f468\u200d\U0001f469\u200d\U0001f467"


def deep_masked(*texts: str) -> list[str]:
    """Each text as `find_deep` and one masker leave it."""
    masker = Masker()
    return [masker.mask(text, SCANNER.find_deep(text)) for text in texts]


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        # The whole of what spelled the secret goes, invisible characters and all.
        ("key AKIA\u200bIOSF\u00adODNN7EXAMPLE ok", "key [API_KEY_1] ok"),
        ("mail jane@ex\u0430mple.com ok", "mail [EMAIL_1] ok"),
        ("mail j\u0430ne@example.com ok", "mail [EMAIL_1] ok"),  # not `j\u0430[EMAIL_1]`
        ("key \\u0041KIAIOSFODNN7EXAMPLE ok", "key [API_KEY_1] ok"),
        ("mail jane%40example.com ok", "mail [EMAIL_1] ok"),
        (f"card {FULLWIDTH_CARD} ok", "card [CARD_1] ok"),
        ("card 4111 . 1111 / 1111 _ 1111 ok", "card [CARD_1] ok"),
        ("SSN 123.45.6789 ok", "SSN [SSN_1] ok"),
        # An encoded run goes whole: where its characters are is not where the
        # secret's are.
        (f"b64 {base64.b64encode(AWS.encode()).decode()} ok", "b64 [API_KEY_1] ok"),
        (f"hex {AWS.encode().hex()} ok", "hex [API_KEY_1] ok"),
        (
            f"b64 {base64.b64encode(f'mail jane@example.com {AWS}'.encode()).decode()} ok",
            "b64 [EMAIL_1] [API_KEY_1] ok",
        ),
        # Normalizing must not end a value early: the text as written is read too.
        ("password=abc%20def rest", "password=[PASSWORD_1] rest"),
    ],
)
def test_find_deep_masks_every_form_whole(text: str, masked: str) -> None:
    assert deep_masked(text) == [masked]


def test_one_secret_is_one_placeholder_in_every_form() -> None:
    forms = [
        AWS,
        "AKIA\u200bIOSFODNN7EXAMPLE",
        "\u0391\u039a\u0399\u0391IOSFODNN7EXAMPLE",
        base64.b64encode(AWS.encode()).decode(),
        AWS.encode().hex(),
        "jane@example.com",
        "JANE@ex\u0430mple.com",
        "4111 1111 1111 1111",
        "4111.1111.1111.1111",
    ]
    assert deep_masked(*forms) == [
        *["[API_KEY_1]"] * 5,
        *["[EMAIL_1]"] * 2,
        *["[CARD_1]"] * 2,
    ]


@pytest.mark.parametrize(
    "text",
    [
        # What normalizing and decoding must not turn into findings.
        "ip 192.168.100.200, date 2024.01.15, 15.01.2024 10.30, version 1.2.3.4.5.6.7",
        "floats [0.1 0.2 0.3 0.4 0.5 0.6 0.7 0.8], pi 3.14159265358979, 0.30000000000000004",
        "prices 12.99 15.49 20.00 8.50 4.99 3.25",
        f"a sha256 {hashlib.sha256(b'x').hexdigest()}, a uuid 123e4567e89b12d3a456426614174000",
        "paths gateway/privacy/normalizer.py and names test_every_message_part_is_masked",
        f"{RUSSIAN} {GREEK} {JAPANESE}",
        f"caf\u00e9 \u2014 3\u20138 s \u2026 \u201cquoted\u201d, e\u0301, {EMOJI}",
    ],
)
def test_find_deep_finds_nothing_in_ordinary_text(text: str) -> None:
    assert SCANNER.find_deep(text) == []


def test_a_run_encoded_twice_is_read_twice_not_more() -> None:
    once = base64.b64encode(AWS.encode())
    twice = base64.b64encode(once).decode()
    thrice = base64.b64encode(twice.encode()).decode()
    assert deep_masked(twice) == ["[API_KEY_1]"]
    assert SCANNER.find_deep(thrice) == []  # MAX_DECODE_DEPTH


def test_leaves_count_each_finding_of_an_encoded_run() -> None:
    run = base64.b64encode(f"jane@example.com {AWS}".encode()).decode()
    (finding,) = SCANNER.find_deep(f"x {run}")
    assert [leaf.category for leaf in finding.leaves()] == ["email", "api_key"]
