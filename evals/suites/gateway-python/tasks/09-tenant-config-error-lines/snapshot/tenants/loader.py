"""The tenant config: one ``[tenant NAME]`` section per tenant::

    [tenant acme]
    rpm = 600
    models = llm-large, llm-small

Comments (from "#" to the end of the line) and blank lines are ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tenants.errors import ConfigError

_HEADER = re.compile(r"\[tenant ([a-z0-9][a-z0-9-]*)\]")
REQUIRED = ("rpm", "models")


@dataclass(frozen=True)
class Tenant:
    name: str
    rpm: int
    models: tuple[str, ...]


def _build(name: str, settings: dict[str, str]) -> Tenant:
    for key in REQUIRED:
        if key not in settings:
            raise ConfigError(f"tenant {name!r}: missing setting {key!r}")
    rpm_text = settings["rpm"]
    if not rpm_text.isdigit() or int(rpm_text) == 0:
        raise ConfigError(f"tenant {name!r}: rpm must be a positive integer")
    models = tuple(m.strip() for m in settings["models"].split(","))
    if not all(models):
        raise ConfigError(f"tenant {name!r}: models must be a comma-separated list")
    return Tenant(name, int(rpm_text), models)


def parse_tenants(text: str) -> list[Tenant]:
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    name = ""
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        header = _HEADER.fullmatch(line)
        if header:
            name = header.group(1)
            if name in sections:
                raise ConfigError(f"duplicate tenant {name!r}")
            current = sections[name] = {}
            continue
        if current is None:
            raise ConfigError("setting outside a [tenant NAME] section")
        key, sep, value = (part.strip() for part in line.partition("="))
        if not sep:
            raise ConfigError(f"expected 'key = value', got {line!r}")
        if key not in REQUIRED:
            raise ConfigError(f"tenant {name!r}: unknown setting {key!r}")
        if key in current:
            raise ConfigError(f"tenant {name!r}: {key!r} set twice")
        current[key] = value
    return [_build(name, settings) for name, settings in sections.items()]


def load_tenants(file: Path) -> list[Tenant]:
    return parse_tenants(file.read_text(encoding="utf-8"))
