"""Reading the YAML files of `gateway eval` (suites, templates, prices, profiles, reviews)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


def read_yaml(path: Path, what: str) -> Any:
    """The YAML document in `path`; ValueError (`file:line: why`) when it cannot be read."""
    try:
        return yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the {what} ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or exc
        raise ValueError(f"{path}{line}: not valid YAML ({problem})") from None


def load_yaml(path: Path, what: str, build: Callable[[Any, Path], T]) -> T:
    """`build(document, path)` of the YAML in `path`; what `build` raises (TypeError,
    ValueError, KeyError) becomes a ValueError naming the file."""
    data = read_yaml(path, what)
    try:
        return build(data, path)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise ValueError(f"{path}: {exc}") from None
