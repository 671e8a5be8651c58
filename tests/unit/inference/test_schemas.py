"""A client's JSON Schema is data: never fetched from, bounded in cost, cached."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jsonschema_rs
import pytest

from gateway.inference import schemas
from gateway.inference.schemas import SchemaLimits, SchemaRefused, check_schema, validator
from gateway.inference.structured import output_problem
from gateway.inference.types import ResponseFormat
from tests.listeners import silent_listener


@pytest.fixture(autouse=True)
def default_limits() -> Iterator[None]:
    yield
    schemas.configure(SchemaLimits())


def nested(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels - 1):
        schema = {"type": "array", "items": schema}
    return schema


@pytest.mark.parametrize(
    "reference",
    [
        "http://127.0.0.1:9/schema.json",
        "https://example.com/s#/defs/a",
        "file:///etc/passwd",
        "other.json",
        "//host/path",
    ],
)
@pytest.mark.parametrize("keyword", ["$ref", "$dynamicRef", "$recursiveRef"])
@pytest.mark.parametrize("compile_patterns", [False, True])
def test_a_reference_outside_the_schema_is_refused_and_named(
    reference: str, keyword: str, compile_patterns: bool
) -> None:
    schema = {"type": "object", "properties": {"a": {keyword: reference}}}
    with pytest.raises(SchemaRefused, match="only references within the schema") as refused:
        check_schema(schema, compile_patterns=compile_patterns)
    assert reference[:40] in str(refused.value)


def test_local_references_and_reference_shaped_data_are_accepted() -> None:
    schema = {
        "$defs": {"name": {"type": "string"}},
        "type": "object",
        "properties": {
            "a": {"$ref": "#/$defs/name"},
            # Instance data that looks like a reference is only data.
            "b": {"enum": [{"$ref": "http://example.com/x"}]},
            "c": {"default": {"$ref": "http://example.com/x"}},
        },
    }
    check_schema(schema, compile_patterns=True)
    assert validator(schema).is_valid({"a": "x", "b": {"$ref": "http://example.com/x"}})


def test_a_pattern_that_backtracks_in_python_is_matched_in_linear_time() -> None:
    fmt = ResponseFormat(
        "json_schema", "s", {"type": "object", "properties": {"a": {"pattern": "^(a+)+$"}}}
    )
    check_schema(fmt.schema or {}, compile_patterns=True)
    # Python's `re` takes years on this text; the linear engine answers at once.
    answer = '{"a": "' + "a" * 100_000 + 'b"}'
    problem = output_problem(fmt, answer)
    assert problem is not None and "does not match" in problem
    assert output_problem(fmt, '{"a": "aaaa"}') is None


def test_pattern_properties_use_the_linear_engine_too() -> None:
    schema = {"type": "object", "patternProperties": {"^(x+)+$": {"type": "integer"}}}
    check_schema(schema, compile_patterns=True)
    assert not validator(schema).is_valid({"x" * 50: "not an integer"})
    assert validator(schema).is_valid({"x" * 50 + "y": "anything"})


@pytest.mark.parametrize("pattern", ["(?=a)b", "(a)\\1", "(?<!x)y"])
def test_a_pattern_that_needs_backtracking_is_refused_with_the_reason(pattern: str) -> None:
    with pytest.raises(SchemaRefused, match="look-around and back-references"):
        check_schema({"type": "string", "pattern": pattern}, compile_patterns=True)


def test_tool_schemas_are_checked_without_compiling_their_patterns() -> None:
    # The gateway never validates arguments against a tool's schema: a pattern only the
    # client's own engine supports is its business.
    check_schema({"type": "string", "pattern": "(?=a)b"})


@pytest.mark.parametrize(
    ("limits", "schema", "cap"),
    [
        (SchemaLimits(max_depth=8), nested(9), "max_depth"),
        (SchemaLimits(max_bytes=200), {"description": "x" * 300}, "max_bytes"),
        (
            SchemaLimits(max_properties=10),
            {"properties": {f"p{i}": {"type": "string"} for i in range(11)}},
            "max_properties",
        ),
        (
            SchemaLimits(max_properties=10),
            {"properties": {"a": {"properties": {f"p{i}": {} for i in range(10)}}}},
            "max_properties",
        ),
    ],
)
def test_each_cap_refuses_what_passes_it_and_names_itself(
    limits: SchemaLimits, schema: dict[str, Any], cap: str
) -> None:
    schemas.configure(limits)
    with pytest.raises(SchemaRefused, match=f"server.json_schema.{cap}"):
        check_schema(schema)


def test_a_schema_nested_past_any_stack_is_refused_not_crashed() -> None:
    # 100,000 levels: a recursive checker would raise RecursionError (a 500).
    with pytest.raises(SchemaRefused, match="more than 32 levels deep"):
        check_schema(nested(100_000))
    check_schema(nested(16))


def test_an_invalid_schema_is_refused_with_the_validator_s_reason_and_where() -> None:
    with pytest.raises(SchemaRefused, match="anyOf"):
        check_schema({"type": 5})
    with pytest.raises(SchemaRefused, match=r"^at /properties/a/type: "):
        check_schema({"properties": {"a": {"type": "strin"}}})


@pytest.fixture
def listener() -> Iterator[tuple[str, list[bytes]]]:
    with silent_listener("/meta") as found:
        yield found


@pytest.mark.parametrize("compile_patterns", [False, True])
@pytest.mark.parametrize("where", ["top", "nested"])
def test_a_meta_schema_other_than_the_drafts_is_refused_and_never_fetched(
    listener: tuple[str, list[bytes]], compile_patterns: bool, where: str
) -> None:
    # jsonschema-rs's meta-validation fetched an unknown `$schema` and waited 30 s.
    url, seen = listener
    schema: dict[str, Any] = {"$schema": url, "type": "object"}
    if where == "nested":
        schema = {"type": "object", "properties": {"a": schema}}
    with pytest.raises(SchemaRefused, match="only the standard drafts"):
        check_schema(schema, compile_patterns=compile_patterns)
    assert seen == []


def test_meta_validation_itself_fetches_nothing(listener: tuple[str, list[bytes]]) -> None:
    # Beneath the check of `$schema`: the registry it validates against retrieves nothing.
    url, seen = listener
    with pytest.raises(jsonschema_rs.ReferencingError, match=r"not fetched|not supported"):
        jsonschema_rs.meta.validate({"$schema": url}, registry=schemas._OFFLINE)
    assert seen == []


@pytest.mark.parametrize(
    "draft",
    [
        "http://json-schema.org/draft-07/schema#",
        "http://json-schema.org/draft-04/schema#",
        "https://json-schema.org/draft/2020-12/schema",
        "https://json-schema.org/draft/2019-09/schema",
    ],
)
def test_the_standard_drafts_are_accepted(draft: str) -> None:
    check_schema({"$schema": draft, "type": "object"})
    check_schema({"$schema": draft, "type": "object"}, compile_patterns=True)


def test_a_schema_is_compiled_once() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    check_schema(schema, compile_patterns=True)
    # The same schema sent again (a new object, as every request parses its own).
    same = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    assert validator(same) is validator(schema)


def test_a_cached_schema_is_still_refused_past_a_cap() -> None:
    schema = {"description": "x" * 300}
    check_schema(schema)
    schemas.configure(SchemaLimits(max_bytes=200))
    with pytest.raises(SchemaRefused, match="max_bytes"):
        check_schema(schema)


def fan_out(links: int) -> dict[str, Any]:
    """A chain of definitions each checking the next twice: 2^links checks per value."""
    defs: dict[str, Any] = {
        f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}] * 2} for i in range(links)
    }
    defs[f"d{links}"] = {"type": "string"}
    return {"type": "object", "properties": {"a": {"$ref": "#/$defs/d0"}}, "$defs": defs}


def test_references_that_fan_out_at_every_level_are_refused() -> None:
    # Attack: 29 links in 2 KB took 9 s to check one answer, the event loop held.
    with pytest.raises(SchemaRefused, match="references that fan out"):
        check_schema(fan_out(29), compile_patterns=True)
    check_schema(fan_out(5), compile_patterns=True)
    assert validator(fan_out(5)).is_valid({"a": "x"})


def test_recursive_and_shared_definitions_as_clients_write_them_are_accepted() -> None:
    node = {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#"}}}}
    check_schema(node, compile_patterns=True)
    shared = {
        "$defs": {"Money": {"type": "object", "properties": {"amount": {"type": "number"}}}},
        "type": "object",
        "properties": {f"price_{i}": {"$ref": "#/$defs/Money"} for i in range(200)},
    }
    check_schema(shared, compile_patterns=True)


@pytest.mark.parametrize(
    "pattern",
    [
        ".{1,10000}x",  # 40 of them took 420 MB and 1.5 s to compile under jsonschema-rs 0.60
        r"\w{1,1000}z",  # 32 of them took 83 s to check one 60 KB answer under 0.60
        "[a-c]{1000}z",  # a second a value under 0.61, which compiles it happily
        ".{1,251}z",  # 32 of them took 29 s to check one 60 KB answer under 0.60
        "(?:ab|cd|ef){1,100}",  # an alternation repeated: each branch written out
        "((a|b){1,16}){1,16}",  # nested counts multiply
        "a{" + "9" * 5000 + "}",  # past what int() reads: counted as huge, not a crash
        # From the hostile review: what the regex crate reads as a count, the gateway too.
        "[a-c]{1, 1000}z",  # a space in the braces (was counted as 11 literal steps)
        "(?x)[a-c]{1 ,1000}z",
        "(?i)[a-z]{1,250}z",  # case folding: 47 s on 32 values of 60 KB
        r"\s{1,250}z",  # \s is Unicode's: 20 s on 60,000 spaces
    ],
)
def test_a_pattern_past_its_written_out_steps_is_refused_with_what_to_use_instead(
    pattern: str,
) -> None:
    # The cap is the gateway's own count, so it holds on every jsonschema-rs release.
    with pytest.raises(SchemaRefused, match="maxLength"):
        check_schema({"type": "string", "pattern": pattern}, compile_patterns=True)
    with pytest.raises(SchemaRefused, match="maxLength"):
        check_schema({"type": "object", "patternProperties": {pattern: {}}}, compile_patterns=True)


@pytest.mark.parametrize(
    ("pattern", "steps"),
    [
        ("^[a-z0-9_-]{1,64}$", 64),
        (r"^\d{4}-\d{2}-\d{2}$", 34),  # \d is Unicode's digits: four a step
        ("^[0-9]{4}-[0-9]{2}-[0-9]{2}$", 10),
        ("^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", 36),
        ("(ab|c){1,4}", 12),
        ("(?:ab){2}", 4),
        (r"\p{L}{3}", 12),  # a step across Unicode counts four
        ("(?i)ab{2}", 24),  # case folding: the whole eight times
        ("a{ 2 }", 2),
        (".{1,10}", 40),
        ("[^,]{2}", 8),
        ("[]a]{5}", 5),
        (r"[\]{]{4}", 4),
        ("a{2,}b*", 4),
    ],
)
def test_patterns_as_clients_write_them_are_counted_and_accepted(pattern: str, steps: int) -> None:
    assert schemas.pattern_steps(pattern) == steps
    check_schema({"type": "string", "pattern": pattern}, compile_patterns=True)


@pytest.mark.parametrize("pattern", [r"\bword\b", r"a\Bb", r"\\\bx"])
def test_a_word_boundary_is_refused_in_a_schema_answers_are_checked_against(pattern: str) -> None:
    # 0.4 s for `\b\w{1,7}\b` on 32 values of 60 KB, however few its steps.
    with pytest.raises(SchemaRefused, match="word boundary"):
        check_schema({"type": "string", "pattern": pattern}, compile_patterns=True)
    check_schema({"type": "string", "pattern": pattern})  # a tool's parameters: not compiled


def test_an_escaped_backslash_before_b_is_no_word_boundary() -> None:
    check_schema({"type": "string", "pattern": r"^C:\\build$"}, compile_patterns=True)


def test_a_schema_with_more_patterns_than_allowed_is_refused() -> None:
    patterns = [{"pattern": f"^x{i}$"} for i in range(schemas.MAX_PATTERNS + 1)]
    with pytest.raises(SchemaRefused, match=f"at most {schemas.MAX_PATTERNS}"):
        check_schema({"anyOf": patterns}, compile_patterns=True)
    check_schema({"anyOf": patterns[:-1]}, compile_patterns=True)


@pytest.mark.parametrize("name", ["enum", "const", "default", "examples", "$ref", "properties"])
def test_a_property_named_like_a_keyword_is_still_a_schema(name: str) -> None:
    # `{"properties": {"enum": {"$ref": remote}}}`: the property's schema is read.
    schema = {"type": "object", "properties": {name: {"$ref": "http://127.0.0.1:9/s"}}}
    with pytest.raises(SchemaRefused, match="only references within the schema"):
        check_schema(schema)
