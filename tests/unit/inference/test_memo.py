"""`ObjectMemo`: made once per object and kept on it, never confused with another
object (even an equal one), and holding nothing alive: what it keeps goes with its
object."""

from __future__ import annotations

import gc
import weakref

from gateway.inference.memo import ObjectMemo
from gateway.inference.types import Tool, ToolList


def counting() -> tuple[ObjectMemo[object, int], list[object]]:
    made: list[object] = []

    def make(key: object) -> int:
        made.append(key)
        return len(made)

    return ObjectMemo("test", make), made


def test_made_once_per_object_and_never_for_an_equal_other() -> None:
    memo, made = counting()
    first = ToolList([Tool("f")])
    assert memo(first) == memo(first) == 1
    assert memo(ToolList([Tool("f")])) == 2  # equal, but another object: its own value
    assert len(made) == 2


def test_what_is_kept_goes_with_its_object() -> None:
    # A tenant sending a new megabyte of tools each time pinned a gigabyte when a table
    # of the latest lists held them.
    made: list[str] = []

    class Value:
        pass

    memo: ObjectMemo[ToolList, Value] = ObjectMemo("test", lambda key: made.append("x") or Value())
    tools = ToolList([Tool("f", "x" * 1_000_000)])
    gone = weakref.ref(memo(tools))
    del tools
    gc.collect()
    assert gone() is None
    # What has no `__dict__` (a plain tuple) keeps nothing: made each time.
    plain = (Tool("f"),)
    memo(plain)  # type: ignore[arg-type]
    memo(plain)  # type: ignore[arg-type]
    assert len(made) == 3
