"""Log setup. Keys are never logged; prompts only when `server.log_prompts` is on."""

from __future__ import annotations

import logging
import os
import re

# Anything that looks like a bearer token or an OpenAI-style key, wherever it appears.
_SECRET = re.compile(r"(?i)(bearer\s+)\S+|\bsk-[A-Za-z0-9_\-]{4,}")


def redact(text: str) -> str:
    """`text` with API keys replaced by `[REDACTED]`."""
    return _SECRET.sub(lambda m: (m.group(1) or "") + "[REDACTED]", text)


class RedactingFilter(logging.Filter):
    """Redacts keys from every record, as a last line of defence."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True


def configure_logging(level: str | None = None) -> None:
    """One line per record on stderr, secrets redacted."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    handler.addFilter(RedactingFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level or os.environ.get("GATEWAY_LOG_LEVEL", "INFO"))
