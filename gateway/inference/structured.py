"""Whether an answer is what `response_format` asked for: JSON, valid for the schema.

Guided decoding (or the upstream's own structured outputs) should make it so; the
gateway checks the final text anyway, and a client is told when it is not (see
docs/configuration.md) rather than handed JSON its parser will fail on.
"""

from __future__ import annotations

import json

from jsonschema.exceptions import best_match
from jsonschema.validators import validator_for

from gateway.inference.types import ResponseFormat


def output_problem(fmt: ResponseFormat, text: str) -> str | None:
    """What is wrong with `text` as an answer in `fmt`, or None when nothing is."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        return f"the answer is not JSON ({exc})"
    if fmt.type == "json_object" or fmt.schema is None:
        return None if isinstance(value, dict) else "the answer is not a JSON object"
    validator = validator_for(fmt.schema)(fmt.schema)
    error = best_match(validator.iter_errors(value))
    if error is None:
        return None
    where = "/".join(str(part) for part in error.absolute_path) or "the top"
    return f"the answer does not match the schema at {where}: {error.message}"
