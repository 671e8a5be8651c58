"""Structured logs: one JSON object per line, with secrets scrubbed from every field.

Prompts and completions are never logged (the request path does not hand them to the
logger) unless `server.log_prompts` is on. API keys, bearer tokens, cloud keys, private
keys, passwords (in URLs and as key/value pairs) and e-mail addresses (the shapes of
`gateway.privacy.patterns`, which outbound sanitization uses too) are replaced by
`[REDACTED]` in every message and field, as a last line of defence behind code that
should not log them in the first place.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from typing import Any

import orjson

from gateway.privacy.patterns import EMAIL, SECRET_WORDS, SECRETS, Detector, may_hold_secret

# A field whose key is a secret name has its whole value redacted, whatever its type.
_SECRET_KEY = re.compile(rf"(?is).*{SECRET_WORDS}")

# The shapes redacted from logs: every secret, and e-mail addresses.
_DETECTORS = (*SECRETS, EMAIL)


def _redact_with(detector: Detector, text: str) -> str:
    """`text` with the sensitive part of each of `detector`'s matches as `[REDACTED]`."""
    parts: list[str] = []
    position = 0
    for match in detector.matches(text):
        start, end = detector.span(match)
        parts += (text[position:start], "[REDACTED]")
        position = end
    if not parts:
        return text
    parts.append(text[position:])
    return "".join(parts)


def redact(text: str) -> str:
    """`text` with every known secret shape replaced by `[REDACTED]`."""
    if not may_hold_secret(text):
        return text
    # What a redaction puts in ("[REDACTED]") holds no marker: the lower case of the text
    # as it came tells every detector whether to look.
    lowered = text.lower()
    for detector in _DETECTORS:
        if detector.may_match(text, lowered):
            text = _redact_with(detector, text)
    return text


# The `extra` key of a record whose emitter redacted the values a client chose itself
# and vouches for the rest (the access line, one per request): not scanned again, and
# written with the other access lines of its turn of the loop (`BatchingStreamHandler`).
SCRUBBED = "scrubbed"

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
    return may_hold_secret("\n".join(texts))


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
        scrubbed = getattr(record, SCRUBBED, False) is True
        message = record.getMessage()
        entry: dict[str, Any] = {
            "ts": self._timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": message if scrubbed else redact(message),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            if scrubbed or not _maybe_secret(fields):
                entry.update(fields)
            else:
                entry.update(_scrub(fields))
        if record.exc_info:
            entry["exception"] = redact(self.formatException(record.exc_info))
        # Dataclasses go through str() (their repr, which the pre-scan read and which
        # leaves out repr=False fields), not field by field.
        return orjson.dumps(entry, default=str, option=orjson.OPT_PASSTHROUGH_DATACLASS).decode()


class BatchingStreamHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that writes the access lines of one turn of the event loop together.

    Under load many requests end in the same turn of the loop; written one by one, each
    access line (a `SCRUBBED` record, one per request) cost a write system call of its
    own. Such a line is written at the end of the turn it was made in (logging's
    shutdown writes what is left at exit). Every other line is written at once, after
    those waiting, and so is an access line made outside a running loop: a process that
    dies by a signal (uvicorn re-raises SIGTERM once it has shut down) loses at most the
    access lines of its last turn, never its shutdown messages.
    """

    def __init__(self) -> None:
        super().__init__()
        self._pending: list[str] = []
        # The loop that will write the lines pending, at the end of its turn.
        self._scheduled: asyncio.AbstractEventLoop | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:
            self.handleError(record)
            return
        self._pending.append(line)
        if getattr(record, SCRUBBED, False) is not True:
            self.flush()  # not an access line: written now, with those waiting
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
            return
        # A write due on a loop that stopped first never runs: this loop takes it over.
        if self._scheduled is not loop:
            self._scheduled = loop
            loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write the lines waiting, in the order they were made."""
        with self.lock:  # type: ignore[union-attr]
            self._scheduled = None
            lines, self._pending = self._pending, []
            if not lines:
                return
            try:
                self.stream.write("\n".join(lines) + "\n")
                self.stream.flush()
            except (OSError, ValueError):
                # The stream is gone (a closed pipe): logging never raises, and there is
                # nowhere left to tell.
                pass


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
    handler = BatchingStreamHandler()
    # The formatter scrubs message, fields and tracebacks.
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level or os.environ.get("GATEWAY_LOG_LEVEL", "INFO"))
    # watchfiles logs every change in the watched directory at INFO; the reloader logs
    # what matters (a reload applied or refused).
    logging.getLogger("watchfiles").setLevel(logging.WARNING)
