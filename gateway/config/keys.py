"""API keys: hashing, and which forms a config file may hold them in.

Config files hold only `sha256:<hex>` hashes, so a leaked file leaks no key.
A plain key is accepted only from an environment variable, and is hashed as
soon as it is read.
"""

from __future__ import annotations

import hashlib
import re

HASH_PREFIX = "sha256:"
_HASH = re.compile(r"sha256:[0-9a-f]{64}")

PLAIN_KEY_IN_FILE = (
    "plain API key in file; store the output of `gateway hash-key` "
    "or reference an environment variable"
)


class InvalidKey(ValueError):
    """An `api_keys` entry that cannot be used; the message never holds the key."""


def digest(plain: str) -> str:
    """Hex SHA-256 of a presented key: the per-request lookup into `tenant_by_key_hash`."""
    return hashlib.sha256(plain.encode()).hexdigest()


def hash_key(plain: str) -> str:
    """The `sha256:<64 hex>` form of a key, as stored in tenants.yaml."""
    return HASH_PREFIX + digest(plain)


def parse_key_entry(entry: str, env_var: str | None) -> str:
    """Hex digest for one `api_keys` entry, or raise `InvalidKey`.

    `env_var` names the environment variable when the entry was exactly one
    `${VAR}` reference; its value is then the plain key.
    """
    if env_var is not None:
        if not entry:
            raise InvalidKey(f"environment variable {env_var} holds an empty API key")
        return digest(entry)
    if not entry:
        raise InvalidKey("empty API key")
    if _HASH.fullmatch(entry):
        return entry.removeprefix(HASH_PREFIX)
    if entry.startswith(HASH_PREFIX):
        raise InvalidKey("malformed key hash; expected 'sha256:' and 64 lowercase hex digits")
    raise InvalidKey(PLAIN_KEY_IN_FILE)
