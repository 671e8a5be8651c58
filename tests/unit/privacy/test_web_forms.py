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
