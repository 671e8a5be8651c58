"""Encoded runs that decode to text: base64, base64url and hex.

A secret sent as `QUtJQUlPU0ZPRE5ON0VYQU1QTEU=` is still the secret: a model decodes
base64 as readily as it reads English. `encoded_runs` finds the runs of a text that may
be encoded (16 characters or more of one alphabet) and decodes those that decode to
text: UTF-8 without control characters. A run that decodes to bytes (a hash, a random
key, compressed data) is not text and is left alone; so is an identifier, whose letters
are all of one case (real base64 of text mixes both).

Percent-encoding (`%40`) is undone by `gateway.privacy.normalizer` instead: it encodes
character by character, so a finding maps back to just its own characters.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterator
from dataclasses import dataclass

# Shorter runs decode to under 12 bytes: no key, and a short identifier is not a run.
MIN_RUN = 16
_RUN = re.compile(rf"[A-Za-z0-9+/_-]{{{MIN_RUN},}}={{0,2}}")
_HEX = re.compile(r"[0-9a-fA-F]+")
_UPPER = re.compile(r"[A-Z]")
_LOWER = re.compile(r"[a-z]")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


@dataclass(frozen=True, slots=True)
class EncodedRun:
    """`text[start:end]` decodes to `decoded` (as `encoding`: base64, base64url, hex)."""

    start: int
    end: int
    encoding: str
    decoded: str


def encoded_runs(text: str) -> Iterator[EncodedRun]:
    """The runs of `text` that decode to text, left to right."""
    # Runs are looked for only in words long enough to hold one: splitting on
    # whitespace (in C) is about twice as fast as a search that starts in every word.
    position = 0
    for word in [word for word in text.split() if len(word) >= MIN_RUN]:
        position = text.find(word, position)
        for match in _RUN.finditer(word):
            decoded = decode(match.group())
            if decoded is not None:
                start = position + match.start()
                yield EncodedRun(start, start + len(match.group()), decoded[0], decoded[1])
        position += len(word)


def decode(run: str) -> tuple[str, str] | None:
    """`run`'s encoding and the text it decodes to, or None if it is not text."""
    body = run.rstrip("=")
    if _HEX.fullmatch(body) is not None and len(body) % 2 == 0:
        text = _text(bytes.fromhex(body))
        if text is not None:
            return "hex", text
    if _UPPER.search(body) is None or _LOWER.search(body) is None:
        return None  # `snake_case_names`, `CONSTANTS`, hex digests: not base64 of text
    standard = "+" in body or "/" in body
    urlsafe = "-" in body or "_" in body
    if (standard and urlsafe) or len(body) % 4 == 1:
        return None  # two alphabets mixed (a path, a slug), or a length base64 never has
    padded = body + "=" * (-len(body) % 4)
    try:
        raw = (
            base64.urlsafe_b64decode(padded) if urlsafe else base64.b64decode(padded, validate=True)
        )
    except (binascii.Error, ValueError):
        return None
    text = _text(raw)
    if text is None:
        return None
    return ("base64url" if urlsafe else "base64"), text


def _text(raw: bytes) -> str | None:
    """`raw` as text, if it is UTF-8 text without control characters."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if not text.strip() or _CONTROL.search(text) is not None:
        return None
    return text
