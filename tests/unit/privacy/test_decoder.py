"""Encoded runs that decode to text (gateway.privacy.decoder): base64, base64url and hex
of text are read; hashes, random keys and identifiers are not."""

from __future__ import annotations

import base64
import hashlib
import os

import pytest

from gateway.privacy.decoder import decode, encoded_runs

SECRET = "AKIAIOSFODNN7EXAMPLE"


MAIL = "mail jane@example.com"
ODD = "jane@example.com ??>>"  # `?` and `>` make base64url's `_` and `-`
ACCENTS = "caf\u00e9 Z\u00fcrich"


@pytest.mark.parametrize(
    ("run", "encoding", "text"),
    [
        (base64.b64encode(SECRET.encode()).decode(), "base64", SECRET),
        # Padding left off, as JWTs and URLs do.
        (base64.b64encode(MAIL.encode()).decode().rstrip("="), "base64", MAIL),
        (base64.urlsafe_b64encode(ODD.encode()).decode(), "base64url", ODD),
        (SECRET.encode().hex(), "hex", SECRET),
        (SECRET.encode().hex().upper(), "hex", SECRET),
        (base64.b64encode(ACCENTS.encode()).decode(), "base64", ACCENTS),
    ],
)
def test_a_run_that_decodes_to_text_is_read(run: str, encoding: str, text: str) -> None:
    found = list(encoded_runs(f"see {run}, then"))
    assert [(r.start, r.end, r.encoding, r.decoded) for r in found] == [
        (4, 4 + len(run), encoding, text)
    ]


@pytest.mark.parametrize(
    "run",
    [
        hashlib.sha256(b"x").hexdigest(),  # a digest: bytes, not text
        base64.b64encode(os.urandom(30)).decode(),  # a random key
        base64.b64encode(bytes(range(32))).decode(),  # control characters
        "gateway/privacy/normalizer",  # a path: one case only
        "test_every_message_part_is_masked",  # snake_case
        "OutboundGuardPrepareRequest",  # CamelCase that is not base64 of text
        "some/path-with_both+alphabets",  # two alphabets
        "QUtJQUlPU0ZPRE5ON0VYQU1QTEU" + "A",  # a length base64 never has (4n + 1)
    ],
)
def test_a_run_that_is_not_text_is_left_alone(run: str) -> None:
    assert decode(run) is None
    assert list(encoded_runs(f"see {run} then")) == []


def test_short_runs_are_not_runs() -> None:
    short = base64.b64encode(b"a@b.co").decode()  # 8 characters
    assert list(encoded_runs(f"x {short} y")) == []
