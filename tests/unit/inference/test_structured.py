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
        "the answer does not match the schema at days/1: it fails `type` "
        "(properties/days/items/type)"
    )
    assert output_problem(CITY, '{"days": []}') == (
        "the answer does not match the schema at the top: it fails `required` (required)"
    )


def test_no_part_of_the_answer_is_quoted() -> None:
    """The answer is not charged when it fails, so the error must not carry it: not the
    value (`"not": {}` quoted the whole answer), and keys of it only cut short."""
    never = ResponseFormat("json_schema", "never", {"not": {}}, strict=True)
    secret = '{"body": "the whole answer the tenant did not pay for", "items": ["x"]}'
    problem = output_problem(never, secret)
    assert problem == "the answer does not match the schema at the top: it fails `not` (not)"
    keyed = ResponseFormat("json_schema", "k", {"additionalProperties": {"type": "integer"}})
    long_key = "k" * 500
    problem = output_problem(keyed, '{"' + long_key + '": "v"}')
    assert problem is not None and long_key not in problem and '"v"' not in problem
