import pytest

from settings.interpolate import MissingVariable, interpolate, interpolate_tree


def test_default_used_when_unset() -> None:
    text = "${REDIS_URL:-redis://cache.example.internal:6379/0}"
    assert interpolate(text, {}) == "redis://cache.example.internal:6379/0"


def test_default_used_when_empty_and_value_wins_otherwise() -> None:
    assert interpolate("${PORT:-8080}", {"PORT": ""}) == "8080"
    assert interpolate("${PORT:-8080}", {"PORT": "9000"}) == "9000"
    assert interpolate("${PORT}", {"PORT": ""}) == ""


def test_empty_default_and_mixed_text() -> None:
    env = {"HOST": "gw.example.internal"}
    assert interpolate("x${SUFFIX:-}y", env) == "xy"
    assert interpolate("http://${HOST}:${PORT:-80}/v1", env) == "http://gw.example.internal:80/v1"


def test_default_is_literal() -> None:
    env = {"OTHER": "nope"}
    assert interpolate("${A:-${OTHER}", env) == "${OTHER"
    assert interpolate("${A:-$$x}", env) == "$$x"
    assert interpolate("${A:-a b:-c}", env) == "a b:-c"
    assert interpolate("${A:-x}}", env) == "x}"


def test_missing_without_default_still_raises() -> None:
    with pytest.raises(MissingVariable) as info:
        interpolate("${TOKEN_FILE} ${PORT:-1}", {})
    assert info.value.name == "TOKEN_FILE"


def test_dollar_escape_and_no_rescan() -> None:
    assert interpolate("$${HOME:-x}", {}) == "${HOME:-x}"
    assert interpolate("${A:-b}", {"A": "${B}"}) == "${B}"


def test_tree() -> None:
    config = {
        "server": {"port": "${PORT:-8080}", "workers": 4},
        "upstreams": ["${PRIMARY}", "${SECONDARY:-triton-b.example.internal}"],
    }
    env = {"PRIMARY": "triton-a.example.internal"}
    assert interpolate_tree(config, env) == {
        "server": {"port": "8080", "workers": 4},
        "upstreams": ["triton-a.example.internal", "triton-b.example.internal"],
    }
