import importlib
from types import ModuleType

import pytest

from compat import clients, models
from compat.clients import client_is_supported
from compat.models import model_supports


def semver() -> ModuleType:
    return importlib.import_module("compat.semver")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1", (1, 0, 0)),
        ("v1.2", (1, 2, 0)),
        ("1.4.0", (1, 4, 0)),
        (" 10.20.30 ", (10, 20, 30)),
        ("v0.0.7", (0, 0, 7)),
    ],
)
def test_parse_version(text: str, expected: tuple[int, int, int]) -> None:
    assert semver().parse_version(text) == expected


@pytest.mark.parametrize("text", ["", "v", "1.", "1.2.3.4", "1.x", "V1", "1.2-rc1", "latest"])
def test_parse_version_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        semver().parse_version(text)


def test_compare_versions() -> None:
    compare = semver().compare_versions
    assert compare("1.2", "1.2.0") == 0
    assert compare("v2", "2.0.0") == 0
    assert compare("1.10", "1.9") == 1
    assert compare("1.9.9", "1.10") == -1
    assert compare("0.0.1", "0.0.0") == 1
    with pytest.raises(ValueError):
        compare("1.0", "nope")


def test_model_supports_unchanged() -> None:
    assert model_supports("1.2", "tools")
    assert model_supports("v1.10", "tools")
    assert not model_supports("1.1.9", "tools")
    assert model_supports("1.4", "json_schema")
    assert not model_supports("1.3.99", "json_schema")
    assert not model_supports("1.99", "logprobs")
    assert model_supports("2", "logprobs")
    with pytest.raises(KeyError):
        model_supports("1.0", "telepathy")
    with pytest.raises(ValueError):
        model_supports("one", "tools")


@pytest.mark.parametrize(
    ("user_agent", "allowed"),
    [
        ("openai-python/1.40.0", True),
        ("openai-python/1.39.9 extra", False),
        ("openai-python/v1.100", True),
        ("openai-node/4.49.1", False),
        ("openai-node/4.50", True),
        ("openai-node/beta", True),
        ("curl/8.5.0", True),
        ("???", True),
        ("", True),
    ],
)
def test_client_is_supported_unchanged(user_agent: str, allowed: bool) -> None:
    assert client_is_supported(user_agent) is allowed


def test_private_copies_are_gone() -> None:
    assert not hasattr(models, "_parse_version")
    assert not hasattr(clients, "_version_tuple")
    assert not hasattr(models, "_VERSION")
    assert not hasattr(clients, "_VERSION")
