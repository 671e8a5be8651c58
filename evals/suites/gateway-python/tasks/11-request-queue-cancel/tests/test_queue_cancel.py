import pytest

from scheduling.queue import RequestQueue


def drain(queue: RequestQueue) -> list[str]:
    out = []
    while len(queue):
        out.append(queue.pop()[0])
    return out


def test_cancelled_request_is_never_popped() -> None:
    queue = RequestQueue()
    queue.push("a", 1, "pa")
    queue.push("b", 0, "pb")
    queue.push("c", 1, "pc")
    assert queue.cancel("b") is True
    assert len(queue) == 2
    assert "b" not in queue
    assert queue.pop() == ("a", "pa")
    assert queue.pop() == ("c", "pc")
    with pytest.raises(IndexError):
        queue.pop()


def test_cancel_unknown_popped_or_twice_returns_false() -> None:
    queue = RequestQueue()
    assert queue.cancel("ghost") is False
    queue.push("a", 0)
    queue.push("b", 0)
    queue.pop()
    assert queue.cancel("a") is False
    assert queue.cancel("b") is True
    assert queue.cancel("b") is False
    assert len(queue) == 0


def test_peek_skips_cancelled_and_empty_after_cancel_all() -> None:
    queue = RequestQueue()
    queue.push("first", 0)
    queue.push("second", 5)
    queue.cancel("first")
    assert queue.peek_id() == "second"
    queue.cancel("second")
    assert queue.peek_id() is None
    assert len(queue) == 0
    with pytest.raises(IndexError):
        queue.pop()


def test_order_of_others_is_kept() -> None:
    queue = RequestQueue()
    for i in range(10):
        queue.push(f"r{i}", i % 3)
    for i in (0, 4, 5, 9):
        assert queue.cancel(f"r{i}")
    assert drain(queue) == ["r3", "r6", "r1", "r7", "r2", "r8"]


def test_id_can_be_pushed_again_after_cancel() -> None:
    queue = RequestQueue()
    queue.push("x", 0, "old")
    queue.push("y", 1, "y")
    queue.cancel("x")
    queue.push("x", 2, "new")
    assert len(queue) == 2
    assert queue.pop() == ("y", "y")
    assert queue.pop() == ("x", "new")
    assert len(queue) == 0
    with pytest.raises(IndexError):
        queue.pop()


def test_duplicate_push_still_rejected() -> None:
    queue = RequestQueue()
    queue.push("x", 0)
    with pytest.raises(ValueError):
        queue.push("x", 1)
    queue.cancel("x")
    queue.push("x", 1)
    assert queue.peek_id() == "x"


def test_many_cancels() -> None:
    queue = RequestQueue()
    for i in range(1000):
        queue.push(f"r{i}", i % 7)
    for i in range(0, 1000, 2):
        assert queue.cancel(f"r{i}")
    assert len(queue) == 500
    popped = drain(queue)
    assert len(popped) == 500
    assert all(int(rid[1:]) % 2 == 1 for rid in popped)
