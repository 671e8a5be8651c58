"""Patterns for secrets that must never reach a log line."""

from __future__ import annotations

import re

API_KEY = re.compile(r"\bsk-[A-Za-z0-9_-]{8,}")
BEARER = re.compile(r"(?i)\b(bearer\s+)[^\s,;]+")

API_KEY_MASK = "sk-***"
TOKEN_MASK = "***"


def redact(text: str) -> str:
    """Mask the secrets in ``text``.

    An API key is "sk-" followed by at least 8 characters that are letters, digits,
    "-" or "_"; the whole key becomes "sk-***". The token after "Bearer " (any case)
    becomes "***", whatever it looks like. Everything else is kept as it is.
    """
    text = API_KEY.sub(API_KEY_MASK, text)
    return BEARER.sub(lambda match: match.group(1) + TOKEN_MASK, text)
