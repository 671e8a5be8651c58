"""Whether an answer is what `response_format` asked for: JSON, valid for the schema.

Guided decoding (or the upstream's own structured outputs) should make it so; the
gateway checks the final text anyway, and a client is told when it is not (see
docs/configuration.md) rather than handed JSON its parser will fail on. The schema was
checked and compiled when the request was parsed (`gateway.inference.schemas`): offline,
with linear-time patterns, within the caps.
"""

from __future__ import annotations

import json

from gateway.inference.schemas import validator
from gateway.inference.types import ResponseFormat


def output_problem(fmt: ResponseFormat, text: str) -> str | None:
    """What is wrong with `text` as an answer in `fmt`, or None when nothing is."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:  # said in our words: the parser's are its own
        return f"the answer is not JSON (it breaks off or goes wrong at character {exc.pos})"
    except RecursionError:
        return "the answer nests arrays and objects deeper than the gateway reads"
    if fmt.type == "json_object" or fmt.schema is None:
        return None if isinstance(value, dict) else "the answer is not a JSON object"
    error = next(iter(validator(fmt.schema).iter_errors(value)), None)
    if error is None:
        return None
    # Where, and which of the schema's rules, never the value: the answer is not sold
    # (it is not charged), so no part of it may go out in the error (the hostile review
    # of issue 40 had whole answers quoted by `"not": {}`). Keys of the answer are cut.
    where = "/".join(_shown(part) for part in error.instance_path[:MAX_PATH]) or "the top"
    if len(error.instance_path) > MAX_PATH:
        where += "/..."
    rule = "/".join(_shown(part) for part in error.schema_path[-MAX_PATH:])
    keyword = _shown(error.schema_path[-1]) if error.schema_path else "schema"
    return f"the answer does not match the schema at {where}: it fails `{keyword}` ({rule})"


# Parts of a path shown, and characters of each.
MAX_PATH = 8
MAX_PART = 32


def _shown(part: object) -> str:
    text = str(part)
    return text if len(text) <= MAX_PART else text[:MAX_PART] + "..."
