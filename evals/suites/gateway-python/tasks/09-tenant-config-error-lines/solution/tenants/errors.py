"""Errors raised while loading the tenant config."""

from __future__ import annotations


class ConfigError(ValueError):
    """The tenant config is invalid; the message says why and, if known, where."""

    def __init__(self, message: str, path: str | None = None, line: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.path = path
        self.line = line

    def __str__(self) -> str:
        if self.path is not None and self.line is not None:
            return f"{self.path}:{self.line}: {self.message}"
        return self.message
