"""A logging filter that keeps secrets out of every handler it is attached to."""

from __future__ import annotations

import logging

from logsafe.patterns import redact


class RedactingFilter(logging.Filter):
    """Masks API keys and bearer tokens in each record that passes through.

    Attach it to a handler (``handler.addFilter(RedactingFilter())``); it never
    drops a record.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redact(str(record.msg))
        return True


def install(logger: logging.Logger) -> None:
    """Add a RedactingFilter to every handler of ``logger`` that lacks one."""
    for handler in logger.handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
