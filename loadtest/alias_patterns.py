"""What alias patterns cost: one name matched, and a config of many patterns checked.

A client names the model, so the gateway matches a name it chose against every alias
pattern (gateway.config.loader.compile_pattern): the worst shapes of pattern against a
name 10, 40 and 160 KB long, which should take time in proportion to the name (every `*`
but the last is an atomic group: tests/unit/config/test_loader_aliases.py checks that
shape, this the time it buys). Then `gateway check-config` on 300 long patterns, whose
overlaps it compares pair by pair.

    .venv/bin/python -m loadtest.alias_patterns
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import yaml

from gateway.config import hash_key
from gateway.config.loader import check_config, compile_pattern

PATTERNS = ("*a*a*a*a*a*a*b", "claude-*", "*?*?*?*?*?*?x", "a*" * 20 + "b")


def best_of(runs: int, action: Callable[[], object]) -> float:
    """The fastest of `runs` runs of `action`, in ms."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return min(times) * 1000


def matching() -> None:
    print("| pattern | 10 KB name | 40 KB | 160 KB |")
    print("|---|---|---|---|")
    for pattern in PATTERNS:
        regex = compile_pattern(pattern)
        cells = []
        for size in (10_240, 40_960, 163_840):
            cells.append(f"{best_of(5, partial(regex.match, 'a' * size)):.2f} ms")
        print(f"| `{pattern[:24]}` | {' | '.join(cells)} |")


def checking(count: int = 300) -> None:
    patterns = [f"{i:03d}-" + "x?" * 60 + "*" for i in range(count)]
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        tenants = {"tenants": {"acme": {"api_keys": [hash_key("sk-bench")]}}}
        (directory / "tenants.yaml").write_text(yaml.safe_dump(tenants))
        model = {"backend": "openai", "replicas": [{"url": "http://a"}], "aliases": patterns}
        gateway = directory / "gateway.yaml"
        gateway.write_text(yaml.safe_dump({"models": {"large": model}}))
        problems: list[str] = []

        def check() -> None:
            problems[:] = check_config(str(gateway))

        took = best_of(3, check)
    print(f"\ncheck-config, {count} patterns of {len(patterns[0])} characters: "
          f"{took:.0f} ms, {len(problems)} problems")  # fmt: skip


if __name__ == "__main__":
    matching()
    checking()
