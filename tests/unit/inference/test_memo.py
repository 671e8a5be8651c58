"""`IdentityMemo`: made once per object while it is among the latest used, never
confused with another object, even an equal one."""

from __future__ import annotations

from gateway.inference.memo import IdentityMemo


def test_made_once_per_object_and_never_for_an_equal_other() -> None:
    made: list[tuple[int, ...]] = []
    memo = IdentityMemo(lambda key: made.append(key) or len(made))
    first = (1, 2)
    assert memo(first) == memo(first) == 1
    assert memo(tuple([1, 2])) == 2  # equal, but another object: its own value
    assert len(made) == 2


def test_bounded_and_a_dropped_object_is_made_again() -> None:
    made: list[object] = []
    memo = IdentityMemo(lambda key: made.append(key) or len(made), entries=3)
    keys = [object() for _ in range(5)]
    for key in keys:
        memo(key)
    assert len(memo._entries) == 3
    memo(keys[0])  # the oldest went out first
    assert made[-1] is keys[0] and len(made) == 6
    memo(keys[4])  # still in
    assert len(made) == 6
