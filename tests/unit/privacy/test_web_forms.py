"""What web tools write, read as a model reads it (issue 40): URL percent-encoding and
HTML entities decoded wherever they are, values split across lines or table cells joined;
masking replaces the whole of what spelled the value, as written."""

from __future__ import annotations

import pytest

from gateway.privacy.patterns import PERSONAL, SECRETS
from gateway.privacy.scanner import Masker, Scanner

SCANNER = Scanner([*SECRETS, *PERSONAL])
AWS_ID = "AKIAIOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


def masked(text: str) -> str:
    return Masker().mask(text, SCANNER.find_deep(text))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # A query string's parameter whose name says nothing: the key after its `=`.
        (f"https://host/x?q={AWS_SECRET}&x=1", "https://host/x?q=[API_KEY_1]&x=1"),
        (f"id={AWS_ID}&k={AWS_SECRET}", "id=[API_KEY_1]&k=[API_KEY_2]"),
    ],
)
def test_a_bare_aws_secret_is_found_after_an_equals_sign(text: str, expected: str) -> None:
    assert masked(text) == expected


PERCENT = AWS_SECRET.replace("/", "%2F")
JSON_SLASHES = AWS_SECRET.replace("/", "\\/")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # URL percent-encoding, in a query string: the secret's whole encoded span goes,
        # the parameters around it stay.
        (f"https://host/x?q={PERCENT}&region=us", "https://host/x?q=[API_KEY_1]&region=us"),
        (
            f"curl 'https://host/x?aws_access_key_id={AWS_ID}&aws_secret_access_key={PERCENT}'",
            "curl 'https://host/x?aws_access_key_id=[API_KEY_1]&aws_secret_access_key=[PASSWORD_1]'",
        ),
        (
            f"https://host/x?creds={AWS_ID}%3A{PERCENT}",
            "https://host/x?creds=[API_KEY_1]%3A[API_KEY_2]",
        ),
        # Encoded twice (a URL inside a URL's parameter).
        (f"next=%2Fx%3Fq%3D{AWS_SECRET.replace('/', '%252F')}", "next=%2Fx%3Fq%3D[API_KEY_1]"),
        # HTML character references, numeric and named, and JSON's `\/`.
        (f"key {AWS_SECRET.replace('/', '&#x2F;')} ok", "key [API_KEY_1] ok"),
        (f"key {AWS_SECRET.replace('/', '&#47;')} ok", "key [API_KEY_1] ok"),
        (f"key {AWS_SECRET.replace('/', '&#0047')} ok", "key [API_KEY_1] ok"),
        (f"key {AWS_SECRET.replace('/', '&sol;')} ok", "key [API_KEY_1] ok"),
        (f"key {AWS_SECRET.replace('/', '&amp;sol;')} ok", "key [API_KEY_1] ok"),
        ('{"k": "' + JSON_SLASHES + '"}', '{"k": "[API_KEY_1]"}'),
        # A value under a secret name: the whole of it, not up to the `;` of its first
        # reference.
        (
            f"aws_secret_access_key: {AWS_SECRET.replace('/', '&sol;')}",
            "aws_secret_access_key: [PASSWORD_1]",
        ),
        ("mail jane&commat;example&period;com ok", "mail [EMAIL_1] ok"),
        ("mail jane%2540example.com ok", "mail [EMAIL_1] ok"),
    ],
)
def test_encoded_forms_are_masked_whole(text: str, expected: str) -> None:
    assert masked(text) == expected


def test_every_encoded_form_of_one_secret_is_one_placeholder() -> None:
    forms = [
        AWS_SECRET,
        PERCENT,
        AWS_SECRET.replace("/", "%252F"),
        AWS_SECRET.replace("/", "&#x2F;"),
        AWS_SECRET.replace("/", "&#47;"),
        AWS_SECRET.replace("/", "&sol;"),
        JSON_SLASHES,
    ]
    masker = Masker()
    assert [masker.mask(f, SCANNER.find_deep(f)) for f in forms] == ["[API_KEY_1]"] * len(forms)


@pytest.mark.parametrize(
    "text",
    [
        # HTML and URLs that hold nothing: decoding makes no finding of them.
        "<p>Tom &amp; Jerry &mdash; AT&T &copy; 2024, R&D &#8212; 50% off, 100%25 sure</p>",
        "https://example.com/search?q=caf%C3%A9+cr%C3%A8me&page=2&lang=en%2Dus",
        "see https://example.com/a%2Fb%2Fc/index.html?x=1&amp;y=2&amp;z=3",
    ],
)
def test_ordinary_html_and_urls_are_left_alone(text: str) -> None:
    assert SCANNER.find_deep(text) == []
