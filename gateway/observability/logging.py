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
from collections.abc import Callable
from typing import Any

import orjson

# Key names whose value is a secret: `password`, `client_secret`, `AZURE_CLIENT_SECRET`,
# `access_token`, `aws_session_token`, `x-api-key`, `AccountKey`, `Authorization`... A name
# must end with one of these words: `prompt_tokens` or `token_count` is not a secret.
_SECRET_WORDS = (
    r"(?:secret|passw(?:or)?d|token|authorization"
    r"|(?:api|access|private|account|subscription)[_-]?key)(?:[_-]?key)?"
)
# A field whose key is a secret name has its whole value redacted, whatever its type.
_SECRET_KEY = re.compile(rf"(?is).*{_SECRET_WORDS}")
# `key=value`, `key: value`, `"key": "value"`, `'key': 'value'` and `\"key\": \"value\"`
# (JSON inside a JSON string). Names are matched whole: the lookbehind, not `\b`, which
# would not match after the `_` in `client_secret`. A quoted value runs to its closing
# quote (or the end of the line, when the text was cut off); `Authorization: Bearer X`
# keeps its scheme.
_KEY_VALUE = re.compile(
    rf"""(?ix)
    (?P<key>(?<![A-Za-z0-9_.-])[A-Za-z0-9_.-]*?{_SECRET_WORDS})
    (?P<sep>\\?["']?[ \t]*[=:][ \t]*)
    (?:(?P<scheme>(?:bearer|basic|digest|token)[ \t]+)(?=[^\s,;"'`]{{6}})
      |(?!(?:bearer|basic|digest)[ \t]))
    (?P<value>
        \\"(?:[^"\\]|\\(?!"))*(?:\\")?
      | "(?:[^"\\\n]|\\.)*"?
      | '(?:[^'\\\n]|\\.)*'?
      | [^\s,;"'`]+
    )
    """
)


def _redact_value(match: re.Match[str]) -> str:
    """The key/value `match` with only its value replaced, quotes and scheme kept."""
    head = match["key"] + match["sep"]
    value = match["value"]
    for quote in ('\\"', '"', "'"):
        if value.startswith(quote):
            closed = len(value) >= 2 * len(quote) and value.endswith(quote)
            return f"{head}{quote}[REDACTED]{quote if closed else ''}"
    return f"{head}{match['scheme'] or ''}[REDACTED]"


_Replacement = str | Callable[[re.Match[str]], str]
# Not a letter or digit before: `\b` would not match after `_` (`KEY_sk-...`).
_START = r"(?<![A-Za-z0-9])"
_PATTERNS: list[tuple[re.Pattern[str], _Replacement]] = [
    # PEM private keys: from BEGIN to END, or to the end of a text cut off before END.
    (
        re.compile(
            r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----.*?"
            r"(?:-----END[A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----|\Z)",
            re.S,
        ),
        "[REDACTED]",
    ),
    # Passwords in URLs: scheme://user:password@host, user possibly empty
    # (`redis://:pw@host`) or an e-mail address (redacted below). The password runs to
    # the last `@` before the host, first trying without `/` (`https://u:pw@host/a@b`),
    # then with it (`u:p/w@rd@host`; at most 256 characters: an unbounded run to the
    # end of the text is quadratic).
    # Not a host's port (`https://h:443/p@v2`), nor an IPv6 host (`http://[::1]:80/a@b`).
    (
        re.compile(
            r"(?i)(?<![A-Za-z0-9+.-])([a-z][a-z0-9+.-]*://(?!\[)[^\s:/?#\"'<>`]*)"
            r":(?!\d{1,5}(?:[/?#\s]|$))(?:[^\s/\"'<>`]*|[^\s?#\"'<>`]{0,256})@"
        ),
        r"\1:[REDACTED]@",
    ),
    # Authorization headers and bearer tokens (`Bearer KEY`, a placeholder, stays).
    (re.compile(rf"(?i){_START}(bearer|basic)\s+[A-Za-z0-9._~+/=-]{{6,}}"), r"\1 [REDACTED]"),
    # OpenAI-style and gateway keys (sk-..., sk-proj-...), GitHub, Slack, Hugging Face.
    (re.compile(rf"{_START}(?:sk|pk|rk)-[A-Za-z0-9_-]{{4,}}"), "[REDACTED]"),
    (re.compile(rf"{_START}(?:gh[pousr]|github_pat)_[A-Za-z0-9_]{{10,}}"), "[REDACTED]"),
    (re.compile(rf"{_START}xox[abposr]-[A-Za-z0-9-]{{10,}}"), "[REDACTED]"),
    (re.compile(rf"{_START}hf_[A-Za-z0-9]{{20,}}"), "[REDACTED]"),
    # AWS access key ids; Google API keys and OAuth access tokens.
    (re.compile(rf"{_START}(?:AKIA|ASIA)[A-Z0-9]{{16}}(?![A-Za-z0-9])"), "[REDACTED]"),
    (re.compile(rf"{_START}AIza[A-Za-z0-9_-]{{30,}}"), "[REDACTED]"),
    (re.compile(rf"{_START}ya29\.[A-Za-z0-9._-]{{10,}}"), "[REDACTED]"),
    # JSON Web Tokens without their `Bearer`: header.payload.signature.
    (
        re.compile(r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*"),
        "[REDACTED]",
    ),
    # Azure SAS signatures (`...&sig=...`); AccountKey= is a secret name below.
    (re.compile(rf"(?i){_START}(sig=)[^\s&\"'<>`,;]+"), r"\1[REDACTED]"),
    # Secrets given as key=value, key: value, or JSON / Python dict entries.
    (_KEY_VALUE, _redact_value),
    # E-mail addresses. Tried only where a local part starts (not at every `\b` in it:
    # quadratic on `x.x.x...@`).
    (
        re.compile(r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}\b"),
        "[REDACTED]",
    ),
]


# Something every secret shape above contains, in lower case: text without any of these
# is clean, and looking for them (plain substring tests on the lowered text, ten times
# faster than one case-insensitive regex) is much cheaper than trying every pattern.
_MARKERS = (
    "bearer", "basic", "secret", "passw", "token", "key", "authoriz", "://", "@",
    "github_pat", "xox", "hf_", "akia", "asia", "aiza", "ya29.", "eyj", "sig=",
)  # fmt: skip
# Markers behind a shorter one they all contain: clean text pays one test for the group.
_GATED_MARKERS = (
    ("k-", ("sk-", "pk-", "rk-")),
    ("gh", ("ghp_", "gho_", "ghs_", "ghu_", "ghr_")),
)


def _may_hold_secret(text: str) -> bool:
    lowered = text.lower()
    # A loop, not any() over a generator: the clean path runs every test.
    for marker in _MARKERS:
        if marker in lowered:
            return True
    for gate, markers in _GATED_MARKERS:
        if gate in lowered:
            for marker in markers:
                if marker in lowered:
                    return True
    return False


def redact(text: str) -> str:
    """`text` with every known secret shape replaced by `[REDACTED]`."""
    if not _may_hold_secret(text):
        return text
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


# Field keys seen not to be secret names (bounded: keys are a small fixed set in practice).
_CLEAN_KEYS: set[str] = set()
_CLEAN_KEYS_MAX = 4096


def _is_secret_key(key: object) -> bool:
    return _SECRET_KEY.fullmatch(str(key)) is not None


def _maybe_secret(fields: dict[str, Any]) -> bool:
    """Whether any field of `fields` could hold a secret: one scan of them all at once."""
    keys = fields.keys()
    if not keys <= _CLEAN_KEYS:
        for key in keys - _CLEAN_KEYS:
            if _is_secret_key(key):
                return True
            if len(_CLEAN_KEYS) < _CLEAN_KEYS_MAX:
                _CLEAN_KEYS.add(key)
    texts = []
    for value in fields.values():
        if isinstance(value, str):
            texts.append(value)
        elif value is None or isinstance(value, int | float):
            continue
        elif isinstance(value, list | tuple | dict):
            texts.append(str(value))  # its repr holds every string in it
        else:
            return True  # an exception or other object: _scrub makes it a redacted str
    return _may_hold_secret("\n".join(texts))


def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if value is None or isinstance(value, int | float):
        return value
    if isinstance(value, dict):
        return {k: _scrub_field(k, v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_scrub(v) for v in value]
    # Exceptions and other objects would go out as str() through orjson's default.
    return redact(str(value))


def _scrub_field(key: object, value: Any) -> Any:
    if value is not None and not isinstance(value, bool) and _is_secret_key(key):
        return "[REDACTED]"
    return _scrub(value)


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
        # Dataclasses go through str() (their repr, which the pre-scan read and which
        # leaves out repr=False fields), not field by field.
        return orjson.dumps(entry, default=str, option=orjson.OPT_PASSTHROUGH_DATACLASS).decode()


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
