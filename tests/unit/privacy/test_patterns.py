"""What sensitive data looks like (gateway.privacy.patterns): every category found, look-alikes
not."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.privacy.patterns import (
    _KEY_VALUE,
    PERSONAL,
    SECRETS,
    _key_value_matches,
    card_issued,
    host_detector,
    iban_valid,
    is_secret_name,
    luhn_valid,
)
from gateway.privacy.scanner import Masker, Scanner
from tests.unit.observability.secret_samples import SECRETS as SECRET_SAMPLES

HOSTS = host_detector(("corp.example.com", ".internal"))
assert HOSTS is not None
SCANNER = Scanner([*SECRETS, *PERSONAL, HOSTS])


@pytest.mark.parametrize("name", sorted(SECRET_SAMPLES))
def test_every_secret_the_log_redaction_knows_is_found(name: str) -> None:
    text, leftovers = SECRET_SAMPLES[name]
    masked = Masker().mask(text, SCANNER.find(text))
    for leftover in leftovers:
        assert leftover not in masked


@pytest.mark.parametrize(
    ("text", "category", "value"),
    [
        ("mail jane.doe+x@example.co.uk today", "email", "jane.doe+x@example.co.uk"),
        ("card 4111 1111 1111 1111 exp 12/29", "card", "4111 1111 1111 1111"),
        ("card 5500-0000-0000-0004.", "card", "5500-0000-0000-0004"),
        ("IBAN DE89 3704 0044 0532 0130 00 please", "iban", "DE89 3704 0044 0532 0130 00"),
        ("pay GB82WEST12345698765432 now", "iban", "GB82WEST12345698765432"),
        ("call +49 30 1234567 or", "phone", "+49 30 1234567"),
        ("call (555) 123-4567 now", "phone", "(555) 123-4567"),
        ("call 555-123-4567 now", "phone", "555-123-4567"),
        ("on db1.corp.example.com:5432", "host", "db1.corp.example.com"),
        ("see vault.internal.", "host", "vault.internal"),
        ("password: hunter2!", "password", "hunter2!"),
        ("SSN 123-45-6789 on file", "ssn", "123-45-6789"),
        ("SSN 078 05 1120 on file", "ssn", "078 05 1120"),
    ],
)
def test_personal_data_and_internal_hosts_are_found(text: str, category: str, value: str) -> None:
    assert [(f.category, text[f.start : f.end]) for f in SCANNER.find(text)] == [(category, value)]


@pytest.mark.parametrize(
    "text",
    [
        # Look-alikes: a card number failing Luhn, an IBAN failing mod 97, an IP
        # address, a date, a version, a plain number, a public host.
        "order 4111 1111 1111 1112 shipped",
        "ref DE89 3704 0044 0532 0130 01",
        "the server 192.168.100.200 answered on 2026-11-30 at 12:30:45",
        "python 3.11.7, 1048576 bytes, 32768 tokens, 4096 connections",
        "https://api.openai.com/v1 and www.example.com",
        "commit 9fceb02d0ae598e95dc970b74767f19372d61af8",
        "Explain how passwords and API keys should be stored.",
        # Not SSNs: numbers the SSA never issues, mixed separators, a longer run.
        "000-12-3456, 666-12-3456, 912-34-5678, 123-00-4567, 123-45-0000",
        "123-45 6789, 1-123-45-6789, 123-45-6789-0",
    ],
)
def test_look_alikes_are_not_found(text: str) -> None:
    assert SCANNER.find(text) == []


def test_a_key_name_says_its_value_is_a_secret() -> None:
    for name in ("password", "db_password", "client_secret", "x-api-key", "AccountKey", "pw"):
        assert is_secret_name(name), name
    for name in ("description", "prompt_tokens", "token_count", "keyboard", "passwords"):
        assert not is_secret_name(name), name


def test_checksums() -> None:
    assert luhn_valid("4111111111111111") and not luhn_valid("4111111111111112")
    assert iban_valid("DE89 3704 0044 0532 0130 00") and not iban_valid("DE00370400440532013000")


@pytest.mark.parametrize(
    ("number", "issued"),
    [
        ("4111 1111 1111 1111", True),  # Visa
        ("4222222222222", True),  # Visa, 13 digits
        ("5500 0000 0000 0004", True),  # Mastercard
        ("2223 0000 4841 0010", True),  # Mastercard, 2-series
        ("3782 822463 10005", True),  # American Express
        ("3056 9309 0259 04", True),  # Diners Club
        ("3530 1113 3330 0000", True),  # JCB
        ("6011 1111 1111 1117", True),  # Discover
        ("6200 0000 0000 0005", True),  # UnionPay
        ("4111 1111 1111 1112", False),  # Luhn fails
        ("1234 5678 9012 3452", False),  # Luhn passes, no issuer's
        ("2002 2003 2004 2005", False),
        ("3782 8224 6310 0052", False),  # American Express numbers have 15 digits
        ("4111 1111 1111 1111 18", False),  # nor Visa's 18 (Luhn passes)
    ],
)
def test_an_issued_card_passes_luhn_and_its_issuers_prefix_and_length(
    number: str, issued: bool
) -> None:
    assert card_issued(number) is issued


def test_no_suffixes_no_host_detector() -> None:
    assert host_detector(()) is None


@settings(max_examples=500, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                "password",
                "Token",
                "api_key",
                "AccountKey",
                "pw",
                "passphrase",
                "x",
                "9",
                "-",
                "_",
                ".",
                ":",
                "=",
                " ",
                "\t",
                '"',
                "'",
                "\\",
                "Bearer ",
                "v",
                "\n",
            ]
        ),
        max_size=30,
    ).map("".join)
)
def test_the_fast_key_value_finder_finds_what_the_pattern_finds(text: str) -> None:
    # The finder tries the pattern only before separators; it must miss nothing.
    fast = [m.span() for m in _key_value_matches(text)]
    assert fast == [m.span() for m in _KEY_VALUE.finditer(text)]


def test_the_fast_key_value_finder_on_the_samples() -> None:
    for text, _ in SECRET_SAMPLES.values():
        assert [m.span() for m in _key_value_matches(text)] == [
            m.span() for m in _KEY_VALUE.finditer(text)
        ]
