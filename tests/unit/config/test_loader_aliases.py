"""Alias patterns in the config: matching, specificity, and what check-config reports."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import hash_key
from gateway.config.loader import (
    compile_pattern,
    is_pattern,
    pattern_covers,
    pattern_rank,
    patterns_overlap,
)
from tests.unit.config.sample_keys import ACME_KEY
from tests.unit.config.test_loader import problems


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GATEWAY_REDIS_URL", raising=False)


def matches(pattern: str, name: str) -> bool:
    return compile_pattern(pattern).match(name) is not None


def test_star_and_question_mark_are_the_only_wildcards() -> None:
    assert matches("claude-*", "claude-opus-4-8[1m]")
    assert matches("gpt-5*", "gpt-5.6-codex")
    assert matches("gpt-?", "gpt-5")
    assert not matches("gpt-?", "gpt-55")
    assert not matches("claude-*", "xclaude-opus")  # whole names only
    # Brackets are literal, in patterns and names: no character classes.
    assert matches("claude-opus-4-8[1m]", "claude-opus-4-8[1m]")
    assert not matches("claude-opus-4-8[1m]", "claude-opus-4-81")
    assert matches("claude-*[1m]", "claude-opus-4-8[1m]")
    assert not matches("claude-*[1m]", "claude-opus-4-8m")
    assert not is_pattern("claude-opus-4-8[1m]")
    assert is_pattern("claude-*") and is_pattern("gpt-?")
    # A name with wildcard characters of its own is just text.
    assert matches("claude-*", "claude-*?[")
    assert not matches("claude-?", "claude-")
    assert matches("*", "") and not matches("?", "")
    assert matches("modèle-*", "modèle-日本語")
    assert matches("a\\*", "a\\b")  # a backslash is literal too


def test_a_huge_name_is_matched_without_backtracking() -> None:
    # Every `*` but the last is an atomic group: the text it took is never given back,
    # so only the last star backtracks and a name is matched in linear time (measured
    # on this 10 KB name by loadtest/alias_patterns.py).
    name = "a" * 10_240
    for pattern in ("*a*a*a*a*a*a*b", "claude-*", "*?*?*?*?*?*?x", "a*" * 20 + "b"):
        regex = compile_pattern(pattern).pattern
        assert regex.count("(?>") == pattern.count("*") - 1, regex
        assert regex.count(".*") - regex.count("(?>.*?") == 1, regex
        assert not matches(pattern, name)


def test_rank_is_the_literal_prefix_then_the_literal_characters() -> None:
    assert pattern_rank("claude-haiku-*") > pattern_rank("claude-*")
    assert pattern_rank("claude-*-4") > pattern_rank("claude-*")
    assert pattern_rank("claude-*") > pattern_rank("*-codex")
    assert pattern_rank("gpt-?") == (4, 4)


def test_overlap_and_cover() -> None:
    assert patterns_overlap("claude-*", "claude-haiku-*")
    assert patterns_overlap("*-codex", "gpt-*")
    assert patterns_overlap("a?c", "a*")
    assert not patterns_overlap("gpt-*", "codex-*")
    assert not patterns_overlap("abc", "a?")
    assert pattern_covers("gpt-*", "gpt-5*")
    assert pattern_covers("*", "a?b")
    assert not pattern_covers("gpt-5*", "gpt-*")
    assert not pattern_covers("a?", "a*")


TENANTS = f"""\
tenants:
  acme:
    api_keys: ["{hash_key(ACME_KEY)}"]
"""


def gateway(large: str, small: str = "[]") -> str:
    return f"""\
models:
  large:
    backend: openai
    replicas: [{{url: http://a}}]
    aliases: {large}
  small:
    backend: openai
    replicas: [{{url: http://b}}]
    aliases: {small}
"""


def test_patterns_of_different_rank_and_exact_names_are_no_problem() -> None:
    # Exceptions to a pattern are how patterns are meant to be used.
    assert problems(gateway('["claude-*", "gpt-*"]', '["claude-haiku-*", "gpt-4o"]'), TENANTS) == []


def test_equally_specific_patterns_for_different_models_are_ambiguous() -> None:
    assert problems(gateway('["claude-*"]', '["claude-?*"]'), TENANTS) == [
        "gateway.yaml:9: models.small.aliases[0]: pattern 'claude-?*' (model 'small') and "
        "'claude-*' (model 'large', line 5) can match the same name and are as specific: "
        "which one serves it is ambiguous",
    ]
    # Disjoint ones are not.
    assert problems(gateway('["*-codex"]', '["*-mini"]'), TENANTS) == []


def test_a_pattern_that_can_never_win_is_reported() -> None:
    assert problems(gateway('["gpt-*", "gpt-**"]'), TENANTS) == [
        "gateway.yaml:5: models.large.aliases[1]: pattern 'gpt-**' can never win: "
        "'gpt-*' (models' aliases, line 5) takes every name it matches",
    ]


def test_many_long_patterns_are_checked() -> None:
    # How long it takes: loadtest/alias_patterns.py.
    patterns = [f"{i:03d}-" + "x?" * 60 + "*" for i in range(300)]
    assert problems(gateway(str(patterns).replace("'", '"')), TENANTS) == []


def test_an_overlong_alias_is_refused() -> None:
    assert problems(gateway(f'["{"x" * 257}"]'), TENANTS) == [
        "gateway.yaml:5: models.large.aliases[0]: an alias is at most 256 characters",
    ]


def test_tenant_aliases_are_checked() -> None:
    tenants = f"""\
tenants:
  acme:
    api_keys: ["{hash_key(ACME_KEY)}"]
    models: [small]
    aliases:
      "claude-*": small
      "claude-?*": small
      large: small
      "gpt-*": nowhere
      "codex-*": large
      "o?-*": small
      "o*": small
"""
    assert problems(gateway('["claude-*"]'), tenants) == [
        "tenants.yaml:7: tenants.acme.aliases.claude-?*: pattern 'claude-?*' can never win: "
        "'claude-*' (tenants.acme.aliases, line 6) takes every name it matches",
        "tenants.yaml:8: tenants.acme.aliases.large: 'large' is the name of a model, which "
        "is served as itself",
        "tenants.yaml:9: tenants.acme.aliases.gpt-*: model 'nowhere' is not defined",
        "tenants.yaml:10: tenants.acme.aliases.codex-*: tenant 'acme' may not use model "
        "'large' (its `models`)",
    ]


def test_the_demo_config_is_valid() -> None:
    from gateway.config import check_config

    root = Path(__file__).resolve().parents[3]
    assert check_config(str(root / "config" / "gateway.yaml")) == []
    assert check_config(str(root / "config" / "tenants.yaml")) == []
