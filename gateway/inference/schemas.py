"""A client's JSON Schemas (tool parameters, `response_format`) as data, at bounded cost.

A schema comes from a tenant, so nothing in it may make the gateway do unbounded work or
reach anything:

- only local references (`#/...`, `#anchor`) are allowed and `$schema` must name a
  standard draft: a remote `$ref` or another meta-schema is refused at parse time, and
  both validation and meta-validation run offline besides, so nothing is ever fetched;
- `pattern` and `patternProperties` are compiled by jsonschema-rs with the Rust `regex`
  crate, whose matching is linear in the text (no catastrophic backtracking); a pattern
  that needs backtracking (look-around, back-references) is refused with a 400;
- linear in the text is not cheap in the pattern: a counted repetition is written out
  (`\\w{1,1000}z` is a thousand steps), and once a pattern's automaton outgrows the lazy
  DFA's cache the regex crate matches step by step (32 such patterns took 83 s to check
  one 60 KB answer under jsonschema-rs 0.60). What that costs depends on the release
  (0.61 compiles `.{1,10000}` happily and leaves `[a-c]{1000}z` at a second a value), so
  the gateway counts a pattern's written-out steps itself and refuses one past
  MAX_PATTERN_STEPS, whatever jsonschema-rs would do with it;
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

import enum
import re
import urllib.parse
from collections import OrderedDict
from collections.abc import Iterator, Mapping
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
# Checked schemas kept (their JSON only), most recently used last.
_CACHE_SIZE = 512
# Compiled validators kept: each holds its compiled patterns (up to MAX_PATTERNS of at
# most PATTERN_BYTES + PATTERN_DFA_BYTES each), so fewer: 32 x 32 x 384 KiB = 384 MiB at
# the very worst, a few MB for schemas as clients write them.
_VALIDATORS_CACHE_SIZE = 32
_validators: OrderedDict[bytes, jsonschema_rs.Validator] = OrderedDict()
_checked: OrderedDict[bytes, None] = OrderedDict()
# A pattern's compiled size, and the lazy DFA's cache, at most: `.{1,10000}` compiles to
# 12 MB and 33 ms under the regex crate's defaults (10 MB), and a client chooses it.
PATTERN_BYTES = 256 << 10
PATTERN_DFA_BYTES = 128 << 10
# Patterns (`pattern`, each `patternProperties` key) in one compiled schema.
MAX_PATTERNS = 32
# A pattern's steps with its counted repetitions written out (`pattern_steps`): at 256,
# the worst measured took 2 ms to match a 60 KB value (docs/benchmarks.md, "Answer
# schemas"); an identifier of up to 64 characters is 64, a date or a UUID under 40.
MAX_PATTERN_STEPS = 256
# Schema nodes one validation may visit on one value, with every `$ref` expanded: a
# chain of `allOf: [{$ref: next}, {$ref: next}]` doubles at each link (29 links in 2 KB
# took 9 s to validate one answer), a schema as written stays far below it.
MAX_EXPANDED_NODES = 20_000
_REGEX_OPTIONS = jsonschema_rs.RegexOptions(
    size_limit=PATTERN_BYTES, dfa_size_limit=PATTERN_DFA_BYTES
)
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
        _remember(_validators, key, _compile(schema), _VALIDATORS_CACHE_SIZE)
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
    _remember(_validators, key, compiled, _VALIDATORS_CACHE_SIZE)
    return compiled


def _compile(schema: Mapping[str, Any]) -> jsonschema_rs.Validator:
    """A validator for answers: its patterns within their budget, its expansion bounded."""
    patterns = list(_patterns(schema))
    if len(patterns) > MAX_PATTERNS:
        raise SchemaRefused(
            f"it has {len(patterns)} patterns; a schema answers are checked against may have "
            f"at most {MAX_PATTERNS}"
        )
    for pattern in patterns:
        if _WORD_BOUNDARY.search(pattern):
            raise SchemaRefused(
                f"the pattern `{_shown(pattern)}` has a word boundary (`\\b` or `\\B`), which "
                "answers cannot be checked against in linear time: match the words without it"
            )
        steps = pattern_steps(pattern)
        if steps > MAX_PATTERN_STEPS:
            raise SchemaRefused(
                f"the pattern `{_shown(pattern)}` is {steps} steps with its counted repetitions "
                f"written out; at most {MAX_PATTERN_STEPS} are allowed (a long bounded "
                "repetition such as `.{1,1000}` does not fit: use `maxLength`)"
            )
    expanded = _expanded_nodes(schema)
    if expanded > MAX_EXPANDED_NODES:
        raise SchemaRefused(
            f"with its references expanded it has more than {MAX_EXPANDED_NODES} schemas "
            "to check each value against (references that fan out at every level)"
        )
    try:
        return jsonschema_rs.validator_for(
            _as_dict(schema), offline=True, pattern_options=_REGEX_OPTIONS
        )
    except (jsonschema_rs.ValidationError, jsonschema_rs.ReferencingError) as exc:
        message = _first_line(exc)
        if 'is not a "regex"' in message:
            message += (
                " the gateway can match in linear time: look-around and back-references"
                f" are not supported, and a pattern compiles to at most {PATTERN_BYTES >> 10}"
                " KiB (a long bounded repetition such as `.{1,1000}` does not fit: use"
                " `maxLength`)"
            )
        raise SchemaRefused(message) from None


def _shown(pattern: str) -> str:
    return pattern if len(pattern) <= 80 else pattern[:80] + "..."


def _remember(
    cache: OrderedDict[bytes, Any], key: bytes, value: Any, size: int = _CACHE_SIZE
) -> None:
    cache[key] = value
    if len(cache) > size:
        cache.popitem(last=False)


def _patterns(schema: Mapping[str, Any]) -> Iterator[str]:
    """Every `pattern` and `patternProperties` key of the schema's schemas."""
    for node, kind in _nodes(schema):
        if kind is _Kind.SCHEMA:
            assert isinstance(node, dict)
            pattern = node.get("pattern")
            if isinstance(pattern, str):
                yield pattern
            pattern_properties = node.get("patternProperties")
            if isinstance(pattern_properties, dict):
                yield from pattern_properties


# A counted repetition as the regex crate reads one: `{n}`, `{n,}`, `{n,m}`, `{,m}`, with
# spaces allowed inside the braces; a brace with no number in it is a literal brace.
_COUNTED = re.compile(r"\{\s*(\d*)\s*(?:(,)\s*(\d*)\s*)?\}")
# What may follow a group's `(` before its first step: non-capturing, named, look-around,
# inline flags (`(?i)`, `(?x:`).
_GROUP_PREFIX = re.compile(
    r"\?(:|=|!|<=|<!|P?<[A-Za-z_][A-Za-z0-9_]*>|[a-zA-Z-]+:|[a-zA-Z-]+(?=\)))"
)


def pattern_steps(pattern: str) -> int:
    """How many steps (characters, classes, `.`) `pattern` is with each counted
    repetition written out as the regex crate compiles it: `a{3}` is 3, `(ab|c){1,4}`
    is 12, `.{1,10}` is 40 (a step across Unicode counts four), and the whole counts
    eight times with case folding (`(?i)`); `*`, `+` and `?` loop over what
    they follow, so they add nothing; anchors and other assertions are not steps.
    Counted as if the pattern were valid: one that is not is refused by the compiler
    after this."""
    # Per open group: [steps of its finished alternatives, of the current one].
    groups: list[list[int]] = [[0, 0]]
    last = 0  # steps of the atom a quantifier would repeat
    i = 0
    while i < len(pattern):
        char = pattern[i]
        i += 1
        if char == "\\":
            last = _ESCAPE_STEPS.get(pattern[i : i + 1], 1)
            i = _escape_end(pattern, i)
        elif char == ".":
            last = _WIDE_STEP
        elif char == "[":
            start, i = i, _class_end(pattern, i)
            last = _WIDE_STEP if _is_wide_class(pattern[start : i - 1]) else 1
        elif char == "(":
            groups.append([0, 0])
            if group_prefix := _GROUP_PREFIX.match(pattern, i):  # `(?:`, `(?<name>`...
                i = group_prefix.end()
            last = 0
            continue
        elif char == ")" and len(groups) > 1:
            alternatives, current = groups.pop()
            last = alternatives + current
        elif char == "|":
            groups[-1][0] += groups[-1][1]
            groups[-1][1] = 0
            last = 0
            continue
        elif char in "^$":
            last = 0
        elif (
            char == "{"
            and (counted := _COUNTED.match(pattern, i - 1))
            and counted[1] + (counted[3] or "")
        ):
            low, comma, high = counted.groups()
            times = _number(high) if high else _number(low or "0") + (1 if comma else 0)
            groups[-1][1] += last * (max(times, 1) - 1)
            last *= max(times, 1)
            i = counted.end()
            continue
        elif char in "*+?":
            continue
        else:
            last = 1
        groups[-1][1] += last
        if groups[-1][1] > 1 << 30:  # counted far past any cap: no need to go on
            break
    while len(groups) > 1:  # an unclosed group: refused later, counted anyway
        alternatives, current = groups.pop()
        groups[-1][1] += alternatives + current
    steps = groups[0][0] + groups[0][1]
    return steps * _SLOW_MATCH_FACTOR if _SLOW_MATCH.search(pattern) else steps


# `.`, a negated class and the escapes below match across Unicode: one step of them is
# an automaton of several states (UTF-8), so it counts as four. At the cap, `.{1,63}z`
# costs what `[a-c]{1,251}z` does; `.{1,251}z` took 29 s (docs/benchmarks.md).
_WIDE_STEP = 4
_WIDE_ESCAPES = frozenset("wsdWSDpPu")
# Case folding (`(?i)`, which the regex crate accepts: the Kelvin sign folds to `k`)
# makes every step an alternation across Unicode: such a pattern's steps count eight
# times. `(?i)[a-z]{1,250}z` took 47 s on 32 values of 60 KB before it was priced.
_SLOW_MATCH = re.compile(r"\(\?[a-zA-Z-]*i")
_SLOW_MATCH_FACTOR = 8
# A word boundary (`\\b`, `\\B`: Unicode ones, as the regex crate reads them) keeps the
# lazy DFA from matching non-ASCII text at all; the slower engine then pays per character
# whatever the pattern's size (`\\b\\w{1,7}\\b`: 0.4 s on 32 values of 60 KB), so it is
# refused. An escaped backslash before the `b` (`\\\\b`) is a backslash and a `b`.
_WORD_BOUNDARY = re.compile(r"(?<!\\)(?:\\\\)*\\[bB]")
# What an escape is worth, by the letter after its backslash (1 when not named here): a
# word boundary is no step.
_ESCAPE_STEPS = {"b": 0, "B": 0} | dict.fromkeys(_WIDE_ESCAPES, _WIDE_STEP)


def _is_wide_class(members: str) -> bool:
    """Whether a character class (its text between the brackets) matches across Unicode:
    negated, or naming a Unicode set, or any character past ASCII."""
    return (
        members.startswith("^")
        or any(f"\\{escape}" in members for escape in _WIDE_ESCAPES | {"x"})
        or not members.isascii()
    )


def _number(digits: str) -> int:
    # Past nine digits it is past every cap; int() of thousands of digits is refused.
    return int(digits) if len(digits) <= 9 else 10**9


def _escape_end(pattern: str, start: int) -> int:
    """Where the escape whose backslash ends at `start` ends (`\\p{L}`, `\\u{1F600}`,
    `\\x41`, `\\d`...)."""
    if start >= len(pattern):
        return start
    if pattern[start] in "pPu" and pattern[start + 1 : start + 2] == "{":
        close = pattern.find("}", start + 2)
        return len(pattern) if close < 0 else close + 1
    return start + 1


def _class_end(pattern: str, start: int) -> int:
    """Where the character class opened just before `start` ends (past its `]`)."""
    i = start
    if pattern[i : i + 1] == "^":
        i += 1
    if pattern[i : i + 1] == "]":  # a leading `]` is a member
        i += 1
    while i < len(pattern):
        if pattern[i] == "\\":
            i = _escape_end(pattern, i + 1)
            continue
        if pattern[i] == "]":
            return i + 1
        i += 1
    return i


def _expanded_nodes(root: Mapping[str, Any]) -> int:
    """How many schema nodes validating one value may visit, with `#/...` references
    expanded (a reference back into its own path counted once: it recurses into the
    value, which is bounded), up to just past MAX_EXPANDED_NODES."""
    memo: dict[int, int] = {}
    on_path: set[int] = set()

    def size(node: object, depth: int) -> int:
        if not isinstance(node, dict | list):
            return 0
        if id(node) in memo:
            return memo[id(node)]
        if id(node) in on_path or depth > 4 * _limits.max_depth:
            return 1
        on_path.add(id(node))
        total = 1
        children = node.values() if isinstance(node, dict) else node
        for child in children:
            total += size(child, depth + 1)
            if total > MAX_EXPANDED_NODES:
                break
        if isinstance(node, dict) and total <= MAX_EXPANDED_NODES:
            for keyword in _REFERENCES:
                target = _resolve(root, node.get(keyword))
                if target is not None:
                    total += size(target, depth + 1)
        on_path.discard(id(node))
        memo[id(node)] = total
        return total

    return size(root, 1)


def _resolve(root: Mapping[str, Any], reference: object) -> object | None:
    """What a local JSON-pointer reference (`#`, `#/a/b`) names in `root`, or None."""
    if not isinstance(reference, str) or not reference.startswith("#"):
        return None
    node: object = root
    pointer = reference[1:]
    if not pointer:
        return node
    if not pointer.startswith("/"):
        return None  # an anchor: counted as the node it stands in
    for raw in pointer[1:].split("/"):
        part = urllib.parse.unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdecimal() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


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


class _Kind(enum.Enum):
    """What a node of a schema document is."""

    SCHEMA = "schema"  # a schema: its keys are keywords
    NAMES = "names"  # a map of names to schemas (`properties`, `$defs`, ...)
    DATA = "data"  # instance data (`enum`, `const`, `default`, examples): never read


# Keywords whose value maps names (chosen by the client) to schemas.
_NAME_MAPS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)


def _nodes(schema: Mapping[str, Any]) -> Iterator[tuple[object, _Kind]]:
    """Every dict of the schema (a schema or a map of names to schemas) with its kind,
    iteratively, so that a schema nested past the cap costs a loop, not the stack; the
    depth cap is checked on the way."""
    caps = _limits
    stack: list[tuple[object, int, _Kind]] = [(schema, 1, _Kind.SCHEMA)]
    while stack:
        node, depth, kind = stack.pop()
        if depth > caps.max_depth:
            raise SchemaRefused(
                f"it nests JSON objects and arrays more than {caps.max_depth} levels deep, "
                "each `properties` counting as one (server.json_schema.max_depth)"
            )
        if isinstance(node, list):
            stack.extend((item, depth + 1, kind) for item in node if isinstance(item, dict | list))
            continue
        if not isinstance(node, dict):
            continue
        yield node, kind
        for key, value in node.items():
            if not isinstance(value, dict | list):
                continue
            if kind is _Kind.NAMES:
                child = _Kind.SCHEMA  # a name's value is a schema, whatever the name
            elif kind is _Kind.DATA or key in _DATA:
                child = _Kind.DATA
            else:
                child = _Kind.NAMES if key in _NAME_MAPS else _Kind.SCHEMA
            stack.append((value, depth + 1, child))


def _walk(schema: Mapping[str, Any]) -> None:
    """Refuse a schema past the depth or properties caps, or with a reference outside
    itself or a meta-schema other than the drafts."""
    properties = 0
    for node, kind in _nodes(schema):
        if kind is not _Kind.SCHEMA:
            continue
        assert isinstance(node, dict)
        for key, value in node.items():
            if key in _REFERENCES and isinstance(value, str):
                _check_reference(key, value)
            elif key == "$schema" and value not in _DRAFTS:
                _refuse_meta_schema(value)
            elif key in ("properties", "patternProperties") and isinstance(value, dict):
                properties += len(value)
    caps = _limits
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
