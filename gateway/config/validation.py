"""Pydantic validation errors as `file:line: message` problems, in config terms."""

from __future__ import annotations

import re
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from gateway.config.source import Loc, Problem, Source

M = TypeVar("M", bound=BaseModel)


def validate_source(model: type[M], source: Source) -> tuple[M | None, list[Problem]]:
    """`source`'s data as a `model`, or the problems that stop it, each at its line."""
    try:
        return model.model_validate(source.data), []
    except ValidationError as e:
        errors = e.errors(include_url=False, include_input=False)
        return None, [_error_problem(source, err) for err in errors if _reportable(source, err)]


def _reportable(source: Source, error: ErrorDetails) -> bool:
    """False for errors on values whose env substitution already failed."""
    loc = tuple(error["loc"])
    return not any(loc[: len(bad)] == bad for bad in source.unresolved)


# Pydantic's wording for these names internal classes; say it in config terms.
_MESSAGES = {
    "model_type": "expected a mapping",
    "model_attributes_type": "expected a mapping",
    "dict_type": "expected a mapping",
    "list_type": "expected a list",
}


# A key repeated in a message only if it looks like a config key: a file that is no
# config (a secrets file named by mistake) must not be echoed into the output.
_KEY_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def _shown_key(key: object) -> str:
    text = str(key)
    return f"'{text}'" if _KEY_NAME.fullmatch(text) else f"(not a name, {len(text)} characters)"


def _error_problem(source: Source, error: ErrorDetails) -> Problem:
    loc: Loc = tuple(error["loc"])
    kind = error["type"]
    if kind in ("extra_forbidden", "missing"):
        what = "unknown key" if kind == "extra_forbidden" else "missing required key"
        return source.problem(loc, at(loc[:-1], f"{what} {_shown_key(loc[-1])}"), at_key=True)
    if not loc and source.data is None:
        return source.problem(loc, "file is empty")
    message = _MESSAGES.get(kind, error["msg"])
    if kind == "value_error":  # our own validators' words, without pydantic's "Value error, "
        message = str(error.get("ctx", {}).get("error", message))
    return source.problem(loc, at(loc, message))


def as_dict(value: Any) -> dict[str, Any]:
    """`value` if it is a mapping, else empty: cross checks on a file's plain data skip
    what the schema's validation reports."""
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    """`value` if it is a list, else empty (as `as_dict`)."""
    return value if isinstance(value, list) else []


def at(loc: Loc, message: str) -> str:
    """`models.llm-large.replicas[0].url: message`, or just `message` at the top."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return f"{path.lstrip('.')}: {message}" if path else message
