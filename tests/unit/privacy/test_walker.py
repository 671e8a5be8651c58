"""Every string of a structure (gateway.privacy.walker): found and replaced in
dataclasses, tuples, lists and JSON, keys included, without naming a field."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gateway.privacy.walker import Walker


class Kind(StrEnum):
    CHAT = "chat"


@dataclass(frozen=True)
class Inner:
    text: str
    schema: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Outer:
    kind: Kind
    name: str
    items: tuple[Inner, ...]
    count: int = 0
    extra: object = None
    hidden: str = "not walked"


WALKER = Walker({Outer: frozenset({"hidden"})})


def sample() -> Outer:
    shared = Inner("shared")
    schema = {"type": "object", "properties": {"password": "pw1"}, "enum": ["a", "b"]}
    return Outer(Kind.CHAT, "n", (Inner("t", schema), shared, shared), 3, {"meta": ["m"]})


def test_every_string_is_found_once_with_the_key_it_is_the_value_of() -> None:
    found = list(WALKER.strings(sample()))
    assert sorted(found, key=str) == sorted(
        [
            ("n", None), ("t", None), ("type", None), ("object", "type"),
            ("properties", None), ("password", None), ("pw1", "password"),
            ("enum", None), ("a", "enum"), ("b", "enum"), ("shared", None),
            ("meta", None), ("m", "meta"),
        ],
        key=str,
    )  # fmt: skip
    # Not the enum (a `str` too), not the field left out, the shared object once.
    assert ("chat", None) not in found and ("not walked", None) not in found


def test_rewrite_replaces_every_string_and_keeps_what_did_not_change() -> None:
    original = sample()
    rewritten = WALKER.rewrite(original, lambda text, key: text.upper() if key else text)
    assert rewritten.items[0].schema == {
        "type": "OBJECT", "properties": {"password": "PW1"}, "enum": ["A", "B"],
    }  # fmt: skip
    assert rewritten.extra == {"meta": ["M"]}
    assert rewritten.kind is Kind.CHAT and rewritten.hidden == "not walked"
    # What did not change is the same object; a shared object stays shared.
    assert rewritten.items[1] is original.items[1] and rewritten.items[2] is rewritten.items[1]
    assert original.items[0].schema["enum"] == ["a", "b"]  # the original is not changed


def test_nothing_to_replace_gives_back_the_same_structure() -> None:
    original = sample()
    assert WALKER.rewrite(original, lambda text, key: text) is original


def test_dictionary_keys_are_replaced_too() -> None:
    rewritten = WALKER.rewrite({"secret-name": 1}, lambda text, key: text.replace("secret", "x"))
    assert rewritten == {"x-name": 1}


def test_deep_json_is_walked_without_recursion_limits() -> None:
    deep: Any = "leaf"
    for _ in range(5000):
        deep = [deep]
    assert list(WALKER.strings(deep)) == [("leaf", None)]
