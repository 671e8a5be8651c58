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


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # A card split across lines or cells: the whole split span goes, every break and
        # cell boundary inside it, the table's outer syntax stays.
        ("card 4111 1111\n1111 1111 ok", "card [CARD_1] ok"),
        ("| 4111 | 1111 | 1111 | 1111 |", "| [CARD_1] |"),
        ("| 4111 | 1111 |\n| 1111 | 1111 |", "| [CARD_1] |"),
        ("<td>4111</td><td>1111</td><td>1111</td><td>1111</td>", "<td>[CARD_1]</td>"),
        ("Amex 3782 822463\n10005.", "Amex [CARD_1]."),
        # Split and encoded: `&#49;` is `1`, `%20` a space and `%0A` a line break.
        ("| 4111 | 1111 | &#49;111 | 1111 |", "| [CARD_1] |"),
        ("4111%201111%0A1111%201111", "[CARD_1]"),
    ],
)
def test_a_card_split_across_lines_or_cells_is_masked_whole(text: str, expected: str) -> None:
    assert masked(text) == expected


def test_a_split_card_is_the_same_placeholder_as_the_card_on_one_line() -> None:
    forms = ["4111 1111 1111 1111", "4111 1111\n1111 1111", "| 4111 | 1111 | 1111 | 1111 |"]
    masker = Masker()
    assert [masker.mask(f, SCANNER.find_deep(f)) for f in forms] == [
        "[CARD_1]",
        "[CARD_1]",
        "| [CARD_1] |",
    ]


@pytest.mark.parametrize(
    "text",
    [
        # Numbers on two lines that are no card: Luhn fails.
        "We shipped 4111 1111\n1111 1112 units on Monday.",
        "Order 4111 1111\n1111 1112 shipped",
        # Luhn passes, but no issuer starts its cards so: a row of figures, the years.
        "| 1234 | 5678 | 9012 | 3452 |",
        "| 2002 | 2003 | 2004 | 2005 |",
        "Totals 1234 5678\n9012 3452",
        # A card's digits as figures in a column, or in a row with its label.
        "Revenue:\n4111\n1111\n1111\n1111\n",
        "| Q1 | 4111 | 1111 | 1111 | 1111 |",
        # Phone and social security numbers are not read across lines or cells.
        "| 555 | 123 | 4567 |",
        "call 555 123\n4567",
        "| 123 | 45 | 6789 |",
    ],
)
def test_split_numbers_that_are_no_card_are_left_alone(text: str) -> None:
    assert SCANNER.find_deep(text) == []


# What a hostile tenant can send: a body's worth (1 MiB, `server.max_body_bytes`' default)
# of what every reading looks for. Each must complete: every reading is linear (a
# quadratic one would take hours here); no time is asserted, docs/outbound.md has them.
MIB = 1 << 20
HOSTILE = [
    *("%", "%2", "%25", "%41", "%C3", "%E2%82", "\\/", "\\u00"),
    *("&#", "&#x", "&#0", "&#38;", "&amp;", "&sol;", "&" + "a" * 31 + ";"),
    *("|", "\n", "| ", " " * 17 + "|", "1|", "11|", "1\n", "1 ", "11 ", "1111\n1111 "),
    *("4111 | ", "1 |\n| 1", "<td>1111</td>", "<td" + " " * 70 + ">1", "1."),
]


def hostile(unit: str, size: int) -> str:
    return (unit * (size // len(unit) + 1))[:size]


@pytest.mark.parametrize("unit", ["%", "&#", "|", "\n"])
def test_a_body_of_escapes_breaks_and_cells_is_read_to_its_end(unit: str) -> None:
    text = hostile(unit, MIB)
    assert SCANNER.find_deep(text) == []


def test_a_body_of_every_hostile_form_is_read_to_its_end() -> None:
    # 1 MiB in blocks of each form (32 KiB, enough for a quadratic reading to hang).
    text = "".join(hostile(unit, MIB // len(HOSTILE)) for unit in HOSTILE)
    assert len(text) > MIB - len(HOSTILE)
    assert masked(text) == text
