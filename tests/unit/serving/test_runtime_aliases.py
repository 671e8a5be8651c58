"""`Aliases`: which model a name a client sends stands for, per tenant."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config import ModelConfig, TenantsConfig
from gateway.serving import runtime
from gateway.serving.runtime import Aliases


def model(*aliases: str) -> ModelConfig:
    return ModelConfig.model_validate(
        {"backend": "openai", "replicas": [{"url": "http://a"}], "aliases": list(aliases)}
    )


def tenants(**aliases: dict[str, str]) -> TenantsConfig:
    entries: dict[str, Any] = {"plain": {"api_keys": ["sha256:" + "0" * 64]}}
    for i, (name, own) in enumerate(aliases.items()):
        entries[name] = {"api_keys": ["sha256:" + str(i + 1) * 64], "aliases": own}
    return TenantsConfig.model_validate({"tenants": entries})


MODELS = {
    "large": model("claude-*", "gpt-*", "claude-sonnet-5-5"),
    "small": model("claude-haiku-*", "gpt-5.6-codex-mini"),
    "coder": model("claude-opus-4-8[1m]", "*-codex"),
}


def test_exact_beats_pattern_and_specific_beats_general() -> None:
    aliases = Aliases(MODELS, tenants())
    assert aliases.resolve("plain", "claude-sonnet-5-5") == "large"
    assert aliases.resolve("plain", "claude-haiku-4-5-20251001") == "small"  # longer prefix
    assert aliases.resolve("plain", "claude-opus-4-8") == "large"
    # The exact name with its literal brackets, before `claude-*`.
    assert aliases.resolve("plain", "claude-opus-4-8[1m]") == "coder"
    assert aliases.resolve("plain", "claude-opus-4-8[1m]x") == "large"
    assert aliases.resolve("plain", "gpt-5.6-codex-mini") == "small"
    assert aliases.resolve("plain", "gpt-5.6-codex") == "large"  # `gpt-` beats `` of `*-codex`
    assert aliases.resolve("plain", "o4-codex") == "coder"
    assert aliases.resolve("plain", "llama") is None


def test_a_tenant_map_wins_over_the_models_aliases() -> None:
    aliases = Aliases(MODELS, tenants(globex={"claude-*": "small", "gpt-5.6-codex": "coder"}))
    assert aliases.resolve("globex", "claude-haiku-4-5") == "small"
    assert aliases.resolve("globex", "claude-sonnet-5-5") == "small"  # over an exact alias
    assert aliases.resolve("globex", "claude-opus-4-8[1m]") == "small"
    assert aliases.resolve("globex", "gpt-5.6-codex") == "coder"
    assert aliases.resolve("globex", "gpt-4o") == "large"  # not in its map: the models'
    assert aliases.resolve("globex", "nothing") is None
    # Other tenants are not affected, with or without the cache.
    for _ in range(2):
        assert aliases.resolve("plain", "claude-haiku-4-5") == "small"
        assert aliases.resolve("plain", "claude-sonnet-5-5") == "large"
        assert aliases.resolve("globex", "claude-sonnet-5-5") == "small"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("", None),
        ("*", None),
        ("?", None),
        ("[", None),
        ("]", None),
        ("[1m]", None),
        ("claude-[", "large"),
        ("*-codex", "coder"),
        ("gpt-?", "large"),
        ("模型-*", None),
        ("claude-模型", "large"),
        ("\x00", None),
        ("a" * 10_240, None),
        ("claude-" + "a" * 10_240, "large"),
    ],
)
def test_worst_names_resolve_or_not_without_error(name: str, expected: str | None) -> None:
    aliases = Aliases(MODELS, tenants())
    assert aliases.resolve("plain", name) == expected
    assert aliases.resolve("plain", name) == expected  # from the cache, or matched again


def test_names_with_wildcards_are_literal_text() -> None:
    aliases = Aliases(MODELS, tenants())
    assert aliases.resolve("plain", "claude-*") == "large"  # `claude-*` matches the text
    assert aliases.resolve("plain", "gpt-?") == "large"
    assert aliases.resolve("plain", "claude-opus-4-8[1]") == "large"  # no class read


def test_the_cache_is_bounded_and_skips_long_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "ALIAS_CACHE_SIZE", 8)
    aliases = Aliases(MODELS, tenants(globex={"x-*": "small"}))
    for i in range(100):
        assert aliases.resolve("plain", f"claude-{i}") == "large"
        assert aliases.resolve("globex", f"x-{i}") == "small"
    assert aliases.resolve("plain", "claude-" + "9" * 300) == "large"
    assert len(aliases._cache) <= 8
    assert all(len(name) <= runtime.ALIAS_CACHE_MAX_NAME for _, name in aliases._cache)
    # The newest are kept.
    assert ("globex", "x-99") in aliases._cache


def test_an_exact_alias_is_a_dict_lookup_not_cached() -> None:
    aliases = Aliases(MODELS, tenants())
    assert aliases.resolve("plain", "claude-sonnet-5-5") == "large"
    assert aliases._cache == {}
