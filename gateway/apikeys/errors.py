"""Why the key store refused a change (the admin API maps each to its HTTP status)."""

from __future__ import annotations


class KeyRequestInvalid(ValueError):
    """A field of a create or update that cannot be taken (HTTP 400); `param` names it."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class UnknownKey(LookupError):
    """No managed key has this id (HTTP 404)."""


class KeyRevoked(Exception):
    """The key is revoked: it can be read, not changed or rotated (HTTP 409)."""


class KeyChangeConflict(Exception):
    """Other changes to the same key kept winning the race: nothing was written, and the
    change can be sent again (HTTP 409)."""
