"""A client's JSON Schemas (tool parameters, `response_format`) as data, at bounded cost.

A schema comes from a tenant, so nothing in it may make the gateway do unbounded work or
reach anything:

- only local references (`#/...`, `#anchor`) are allowed and `$schema` must name a
  standard draft: a remote `$ref` or another meta-schema is refused at parse time, and
  both validation and meta-validation run offline besides, so nothing is ever fetched;
- `pattern` and `patternProperties` are compiled by jsonschema-rs with the Rust `regex`
  crate, whose matching is linear in the text (no catastrophic backtracking); a pattern
  that needs backtracking (look-around, back-references) is refused with a 400;
- size, depth and the number of properties are capped (`server.json_schema` in
  `gateway.yaml`), checked by one iterative walk before anything else reads the schema,
  so no recursive code meets a schema deeper than the cap;
- checked schemas and compiled validators are cached by the schema's JSON, so an agent
  that sends the same tools and format on every turn pays for checking them once.

jsonschema-rs checks a schema against its meta-schema in less time than orjson takes to
parse the same bytes (3 ms for 740 KB of tool schemas, against 1.5 s for the Python
`jsonschema` package): the check is bounded by the request body's size.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema_rs
import orjson


@dataclass(frozen=True, slots=True)
class SchemaLimits:
    """The caps on one schema; `server.json_schema` in gateway.yaml sets them."""

    # The schema's size as compact JSON.
    max_bytes: int = 65_536
    # Levels of JSON objects and arrays, the schema itself being level 1.
    max_depth: int = 32
    # Entries of `properties` and `patternProperties`, all levels together.
    max_properties: int = 1_024


class SchemaRefused(ValueError):
    """Why a client's schema is not accepted; the message names what is wrong."""


# Keywords whose value is a reference to another schema.
_REFERENCES = frozenset({"$ref", "$dynamicRef", "$recursiveRef"})
# The meta-schemas a `$schema` may name: the standard drafts, which jsonschema-rs ships.
# Any other would be fetched to validate against (jsonschema-rs's meta-validation
# retrieves an unknown one, and waits 30 s on a listener that never answers).
_DRAFTS = frozenset(
    f"{scheme}://json-schema.org/{path}/schema{end}"
    for scheme in ("http", "https")
    for path in ("draft-04", "draft-06", "draft-07", "draft/2019-09", "draft/2020-12")
    for end in ("", "#")
)


def _refuse_retrieval(uri: str) -> Any:
    raise SchemaRefused(f"`{uri}` is not fetched")


# What meta-validation resolves against: the drafts it ships, and nothing it would fetch.
_OFFLINE = jsonschema_rs.Registry([], retriever=_refuse_retrieval)
# Keywords whose value is instance data, not a schema: a `$ref` inside is just a value.
_DATA = frozenset({"enum", "const", "default", "examples", "example"})
# Compiled validators kept, most recently used last.
_CACHE_SIZE = 512
_validators: OrderedDict[bytes, jsonschema_rs.Validator] = OrderedDict()
_checked: OrderedDict[bytes, None] = OrderedDict()
_limits = SchemaLimits()


def configure(limits: SchemaLimits) -> None:
    """Set the caps from the gateway's config (the app factory calls it at start)."""
    global _limits
    _limits = limits


def limits() -> SchemaLimits:
    """The caps in force."""
    return _limits


def check_schema(schema: Mapping[str, Any], *, compile_patterns: bool = False) -> None:
    """Raise `SchemaRefused` unless `schema` is within the caps, refers only to itself
    and is a valid JSON Schema. With `compile_patterns`, its patterns must also compile
    for linear-time matching (needed for a schema the gateway validates answers against).
    """
    key = _key(schema)
    if key in _validators:
        _validators.move_to_end(key)
        return
    if not compile_patterns and key in _checked:
        _checked.move_to_end(key)
        return
    _walk(schema)
    if compile_patterns:
        _remember(_validators, key, _compile(schema))
        return
    try:
        jsonschema_rs.meta.validate(_as_dict(schema), registry=_OFFLINE)
    except jsonschema_rs.ValidationError as exc:
        where = "/".join(str(part) for part in exc.instance_path)
        raise SchemaRefused(f"at /{where}: {exc.message}" if where else exc.message) from None
    except jsonschema_rs.ReferencingError as exc:
        raise SchemaRefused(_first_line(exc)) from None
    _remember(_checked, key, None)


def validator(schema: Mapping[str, Any]) -> jsonschema_rs.Validator:
    """The compiled validator of a schema that `check_schema` accepted (cached)."""
    key = _key(schema)
    found = _validators.get(key)
    if found is not None:
        _validators.move_to_end(key)
        return found
    _walk(schema)
    compiled = _compile(schema)
    _remember(_validators, key, compiled)
    return compiled


def _compile(schema: Mapping[str, Any]) -> jsonschema_rs.Validator:
    try:
        return jsonschema_rs.validator_for(
            _as_dict(schema), offline=True, pattern_options=jsonschema_rs.RegexOptions()
        )
    except (jsonschema_rs.ValidationError, jsonschema_rs.ReferencingError) as exc:
        message = _first_line(exc)
        if 'is not a "regex"' in message:
            message += (
                " (patterns are matched in linear time: look-around and back-references"
                " are not supported)"
            )
        raise SchemaRefused(message) from None


def _remember(cache: OrderedDict[bytes, Any], key: bytes, value: Any) -> None:
    cache[key] = value
    if len(cache) > _CACHE_SIZE:
        cache.popitem(last=False)


def _key(schema: Mapping[str, Any]) -> bytes:
    """The schema as compact JSON: its cache key (a client sends the same schema in the
    same order turn after turn), once its size is within the cap."""
    try:
        key = orjson.dumps(schema)
    except TypeError as exc:  # orjson's own depth limit, or a key that is not a string
        _walk(schema)  # says which cap it passes, if it is the depth
        raise SchemaRefused(str(exc)) from None
    if len(key) > _limits.max_bytes:
        raise SchemaRefused(
            f"it is {len(key)} bytes as JSON; at most {_limits.max_bytes} are allowed "
            "(server.json_schema.max_bytes)"
        )
    return key


def _walk(schema: Mapping[str, Any]) -> None:
    """Refuse a schema past the depth or properties caps, or with a reference outside
    itself."""
    caps = _limits
    properties = 0
    # Iterative, so that a schema nested past the cap costs a loop, not the stack.
    stack: list[tuple[object, int, bool]] = [(schema, 1, False)]
    while stack:
        node, depth, data = stack.pop()
        if depth > caps.max_depth:
            raise SchemaRefused(
                f"it nests JSON objects and arrays more than {caps.max_depth} levels deep, "
                "each `properties` counting as one (server.json_schema.max_depth)"
            )
        if isinstance(node, dict):
            for key, value in node.items():
                if not data and key in _REFERENCES and isinstance(value, str):
                    _check_reference(key, value)
                if not data and key == "$schema" and value not in _DRAFTS:
                    _refuse_meta_schema(value)
                counted = key in ("properties", "patternProperties")
                if counted and not data and isinstance(value, dict):
                    properties += len(value)
                if isinstance(value, dict | list):
                    stack.append((value, depth + 1, data or key in _DATA))
        elif isinstance(node, list):
            stack.extend((item, depth + 1, data) for item in node if isinstance(item, dict | list))
    if properties > caps.max_properties:
        raise SchemaRefused(
            f"it defines {properties} properties; at most {caps.max_properties} are allowed "
            "(server.json_schema.max_properties)"
        )


def _check_reference(keyword: str, target: str) -> None:
    if not target.startswith("#"):
        shown = target if len(target) <= 200 else target[:200] + "..."
        raise SchemaRefused(
            f"`{keyword}` refers to `{shown}`: only references within the schema "
            "(`#/...`) are allowed, nothing is fetched"
        )


def _refuse_meta_schema(value: object) -> None:
    shown = repr(value) if not isinstance(value, str) else f"`{value[:200]}`"
    raise SchemaRefused(
        f"`$schema` names {shown}: only the standard drafts (4, 6, 7, 2019-09, 2020-12) "
        "are known, and no other is fetched"
    )


def _as_dict(schema: Mapping[str, Any]) -> dict[str, Any]:
    # Parsed JSON: a dict already, whatever the declared type says.
    return schema if isinstance(schema, dict) else dict(schema)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
