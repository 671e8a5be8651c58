"""What an answer schema's patterns cost to check, at the gateway's cap and past it.

A tenant chooses `response_format`'s schema, and the gateway checks every answer against
it on the event loop (gateway.inference.structured). This measures, for the installed
jsonschema-rs, the worst shapes of pattern we know, 32 of them (MAX_PATTERNS) in one
schema, against 60 KB values chosen to keep each pattern's automaton busy:

- at the cap (MAX_PATTERN_STEPS written-out steps each): what the gateway accepts;
- past it (about a thousand steps): what it refuses, checked with jsonschema-rs directly
  to show why (`refused` when jsonschema-rs itself would not compile it).

    .venv/bin/python -m loadtest.schema_patterns

Run it under each jsonschema-rs release the range in pyproject.toml allows (a scratch
venv: `uv pip install jsonschema-rs==X orjson` and PYTHONPATH=.): the figures in
docs/benchmarks.md ("Answer schemas") came that way.
"""

from __future__ import annotations

import time
from importlib.metadata import version

import jsonschema_rs

from gateway.inference import schemas

VALUES = {
    "ab": "ab" * 30_000,
    "a b": "a " * 30_000,
    "é": "é" * 60_000,
}


def shapes(steps: int) -> dict[str, str]:
    """Patterns of about `steps` written-out steps, of the kinds that cost most."""
    return {
        "word class": rf"\w{{1,{steps - 1}}}z",
        "small class": rf"[a-c]{{{steps - 1}}}z",
        "pair": rf"(\w\s){{1,{steps // 2 - 1}}}z",
        "any character": rf".{{1,{steps // 4 - 1}}}z",
        "negated class": rf"[^,]{{1,{steps // 4 - 1}}}z",
    }


def worst_check(pattern: str, *, through_gateway: bool) -> str:
    """The slowest check of the three values, in ms, against 32 variants of `pattern`."""
    schema = {
        "type": "object",
        "properties": {
            f"p{i}": {"type": "string", "pattern": f"(?:{pattern})|k{i}"}
            for i in range(schemas.MAX_PATTERNS)
        },
    }
    try:
        if through_gateway:
            checker = schemas.validator(schema)
        else:
            checker = jsonschema_rs.validator_for(schema, pattern_options=schemas._REGEX_OPTIONS)
    except (schemas.SchemaRefused, jsonschema_rs.ValidationError):
        return "refused"
    worst = 0.0
    for value in VALUES.values():
        instance = {f"p{i}": value for i in range(schemas.MAX_PATTERNS)}
        started = time.perf_counter()
        for _ in checker.iter_errors(instance):
            pass
        worst = max(worst, time.perf_counter() - started)
    return f"{worst * 1000:,.1f} ms"


def main() -> None:
    """Print one row per shape: at the cap through the gateway, past it directly."""
    cap = schemas.MAX_PATTERN_STEPS
    print(
        f"jsonschema-rs {version('jsonschema-rs')}, {schemas.MAX_PATTERNS} patterns, 60 KB values"
    )
    print(f"| shape | at the cap ({cap} steps), gateway | about 1,000 steps, jsonschema-rs alone |")
    print("|---|---|---|")
    # Each is made distinct in the schema by `|k<n>`, up to 4 steps more.
    for (name, at_cap), past in zip(shapes(cap - 4).items(), shapes(1_000).values(), strict=True):
        gateway = worst_check(at_cap, through_gateway=True)
        alone = worst_check(past, through_gateway=False)
        print(f"| {name}: `{at_cap}` | {gateway} | {alone} |")


if __name__ == "__main__":
    main()
