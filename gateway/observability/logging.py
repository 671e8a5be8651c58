"""Structured logs: one JSON object per line, with secrets scrubbed from every field.

Prompts and completions are never logged (the request path does not hand them to the
logger). API keys, bearer tokens, cloud keys, private keys, passwords in URLs and
e-mail addresses are replaced by `[REDACTED]` in every message and field, as a last
line of defence behind code that should not log them in the first place.
"""

from __future__ import annotations

import logging
import os
import re
import time
from typing import Any

import orjson

_SECRET_ASSIGNMENT = re.compile(
    r"(?i)\b(aws_secret_access_key|secret|password|passwd|api_key|token)(\s*[=:]\s*)[^\s,;\"']+"
)
_PATTERNS = [
    # Authorization headers and bearer tokens.
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+"), r"\1 [REDACTED]"),
    # OpenAI-style and gateway keys (sk-..., sk-proj-...), GitHub and Slack tokens.
    (re.compile(r"\b(?:sk|pk|rk)-[A-Za-z0-9_-]{4,}"), "[REDACTED]"),
    (re.compile(r"\b(?:ghp|gho|ghs|github_pat|xox[abpr])_[A-Za-z0-9_-]{10,}"), "[REDACTED]"),
    # AWS access key ids and secrets given as key=value.
    (re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"), "[REDACTED]"),
    (_SECRET_ASSIGNMENT, r"\1\2[REDACTED]"),
    # PEM private keys, whole.
    (
        re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.S),
        "[REDACTED]",
    ),
    # Passwords in URLs: scheme://user:password@host.
    (re.compile(r"(\b[a-z][a-z0-9+.-]*://[^/\s:@]+):[^@\s/]+@"), r"\1:[REDACTED]@"),
    # E-mail addresses.
    (re.compile(r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}\b"), "[REDACTED]"),
]


# Something every secret shape above contains, in lower case: text without any of these
# is clean, and looking for them (plain substring tests on the lowered text, ten times
# faster than one case-insensitive regex) is much cheaper than trying every pattern.
_MARKERS = (
    "bearer", "basic", "sk-", "pk-", "rk-", "ghp_", "gho_", "ghs_", "github_pat", "xox",
    "akia", "asia", "secret", "passw", "api_key", "token", "private key", "://", "@",
)  # fmt: skip


def _may_hold_secret(text: str) -> bool:
    lowered = text.lower()
    return any(marker in lowered for marker in _MARKERS)


def redact(text: str) -> str:
    """`text` with every known secret shape replaced by `[REDACTED]`."""
    if not _may_hold_secret(text):
        return text
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def _maybe_secret(fields: dict[str, Any]) -> bool:
    """Whether any value of `fields` could hold a secret: one scan of them all at once."""
    texts = []
    for value in fields.values():
        if isinstance(value, str):
            texts.append(value)
        elif isinstance(value, list | tuple | dict):
            texts.append(str(value))  # its repr holds every string in it
    return _may_hold_secret("\n".join(texts))


def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_scrub(v) for v in value]
    return value


class JsonFormatter(logging.Formatter):
    """`{"ts", "level", "logger", "message", ...fields}`, secrets scrubbed."""

    def __init__(self) -> None:
        super().__init__()
        # The timestamp up to the second, for the second it was made (one line per
        # request shares it with many others).
        self._second = -1
        self._second_text = ""

    def _timestamp(self, created: float) -> str:
        second = int(created)
        if second != self._second:
            self._second = second
            self._second_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._second_text}.{int((created - second) * 1000):03d}Z"

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": self._timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": redact(record.getMessage()),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(_scrub(fields) if _maybe_secret(fields) else fields)
        if record.exc_info:
            entry["exception"] = redact(self.formatException(record.exc_info))
        return orjson.dumps(entry, default=str).decode()


class RedactingFilter(logging.Filter):
    """Redacts secrets from a record's message, for handlers that do not format JSON."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True


def configure_logging(level: str | None = None) -> None:
    """JSON lines on stderr; `GATEWAY_LOG_LEVEL` sets the level (INFO by default)."""
    # No line shows the caller's file, thread or process: don't pay to find them (the
    # logging HOWTO's "Optimization" section).
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler()
    # The formatter scrubs message, fields and tracebacks.
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level or os.environ.get("GATEWAY_LOG_LEVEL", "INFO"))
    # watchfiles logs every change in the watched directory at INFO; the reloader logs
    # what matters (a reload applied or refused).
    logging.getLogger("watchfiles").setLevel(logging.WARNING)
