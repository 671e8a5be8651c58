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


# Something every secret shape above contains: text without any of these is clean, and
# one scan of it is much cheaper than trying every pattern (a log line per request).
_MAYBE_SECRET = re.compile(
    r"(?i)bearer|basic|[spr]k-|gh[pos]_|github_pat|xox|AKIA|ASIA|secret|passw|api_key|token"
    r"|PRIVATE KEY|://|@"
)


def redact(text: str) -> str:
    """`text` with every known secret shape replaced by `[REDACTED]`."""
    if _MAYBE_SECRET.search(text) is None:
        return text
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


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

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": redact(record.getMessage()),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(_scrub(fields))
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
    handler = logging.StreamHandler()
    # The formatter scrubs message, fields and tracebacks.
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level or os.environ.get("GATEWAY_LOG_LEVEL", "INFO"))
