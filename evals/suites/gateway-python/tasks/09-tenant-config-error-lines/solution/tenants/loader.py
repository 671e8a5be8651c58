"""The tenant config: one ``[tenant NAME]`` section per tenant::

    [tenant acme]
    rpm = 600
    models = llm-large, llm-small

Comments (from "#" to the end of the line) and blank lines are ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from tenants.errors import ConfigError

_HEADER = re.compile(r"\[tenant ([a-z0-9][a-z0-9-]*)\]")
REQUIRED = ("rpm", "models")


@dataclass(frozen=True)
class Tenant:
    name: str
    rpm: int
    models: tuple[str, ...]


@dataclass
class _Section:
    name: str
    line: int
    values: dict[str, str] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)


def _build(section: _Section, path: str) -> Tenant:
    name = section.name
    for key in REQUIRED:
        if key not in section.values:
            raise ConfigError(f"tenant {name!r}: missing setting {key!r}", path, section.line)
    rpm_text = section.values["rpm"]
    if not rpm_text.isdigit() or int(rpm_text) == 0:
        raise ConfigError(
            f"tenant {name!r}: rpm must be a positive integer", path, section.lines["rpm"]
        )
    models = tuple(m.strip() for m in section.values["models"].split(","))
    if not all(models):
        raise ConfigError(
            f"tenant {name!r}: models must be a comma-separated list",
            path,
            section.lines["models"],
        )
    return Tenant(name, int(rpm_text), models)


def parse_tenants(text: str, path: str = "<string>") -> list[Tenant]:
    sections: dict[str, _Section] = {}
    current: _Section | None = None
    for line_no, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        header = _HEADER.fullmatch(line)
        if header:
            name = header.group(1)
            if name in sections:
                raise ConfigError(f"duplicate tenant {name!r}", path, line_no)
            current = sections[name] = _Section(name, line_no)
            continue
        if current is None:
            raise ConfigError("setting outside a [tenant NAME] section", path, line_no)
        key, sep, value = (part.strip() for part in line.partition("="))
        if not sep:
            raise ConfigError(f"expected 'key = value', got {line!r}", path, line_no)
        if key not in REQUIRED:
            raise ConfigError(f"tenant {current.name!r}: unknown setting {key!r}", path, line_no)
        if key in current.values:
            raise ConfigError(f"tenant {current.name!r}: {key!r} set twice", path, line_no)
        current.values[key] = value
        current.lines[key] = line_no
    return [_build(section, path) for section in sections.values()]


def load_tenants(file: Path) -> list[Tenant]:
    return parse_tenants(file.read_text(encoding="utf-8"), str(file))
