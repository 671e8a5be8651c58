"""``${NAME}`` environment substitution in config values, applied after YAML parsing."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_REFERENCE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class MissingVariable(KeyError):
    """A config value refers to an environment variable that is not set."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        return f"environment variable {self.name} is not set"


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """Replace each ``${NAME}`` in ``text`` with ``env[NAME]``; ``$$`` is a literal "$".

    ``${NAME:-default}`` gives ``default`` (taken literally, up to the first "}") when
    NAME is unset or empty. Substituted values are not scanned again. Raises
    MissingVariable if a name without a default is not in ``env``.
    """

    def replace(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name is None:
            return "$"
        if default is not None:
            return env.get(name) or default
        if name not in env:
            raise MissingVariable(name)
        return env[name]

    return _REFERENCE.sub(replace, text)


def interpolate_tree(value: Any, env: Mapping[str, str]) -> Any:
    """Apply ``interpolate`` to every string in nested dicts and lists (keys excluded)."""
    if isinstance(value, str):
        return interpolate(value, env)
    if isinstance(value, dict):
        return {key: interpolate_tree(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate_tree(item, env) for item in value]
    return value
