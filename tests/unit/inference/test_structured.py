"""An answer checked against `response_format` (gateway.inference.structured)."""

from __future__ import annotations

from gateway.inference.structured import output_problem
from gateway.inference.types import ResponseFormat

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "array", "items": {"type": "integer"}},
    },
    "required": ["city"],
    "additionalProperties": False,
}
CITY = ResponseFormat("json_schema", "city", SCHEMA, strict=True)


def test_a_valid_answer_has_no_problem() -> None:
    assert output_problem(CITY, '{"city": "Paris", "days": [1, 2]}') is None
    assert output_problem(ResponseFormat("json_object"), '{"any": ["thing"]}') is None


def test_each_problem_is_named() -> None:
    assert output_problem(CITY, "Paris") == (
        "the answer is not JSON (it breaks off or goes wrong at character 0)"
    )
    assert output_problem(CITY, "[" * 100_000) == (
        "the answer nests arrays and objects deeper than the gateway reads"
    )
    assert output_problem(ResponseFormat("json_object"), "[1, 2]") == (
        "the answer is not a JSON object"
    )
    assert output_problem(CITY, '{"city": "Paris", "days": [1, "two"]}') == (
        'the answer does not match the schema at days/1: "two" is not of type "integer"'
    )
    assert output_problem(CITY, '{"days": []}') == (
        'the answer does not match the schema at the top: "city" is a required property'
    )
