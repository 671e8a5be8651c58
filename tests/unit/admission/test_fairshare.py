"""The fair queue of one priority class (SFQ by tokens), on its own."""

from __future__ import annotations

from gateway.admission.fairshare import FairQueue


def test_cancelled_heads_do_not_pile_up_in_the_heap() -> None:
    queue: FairQueue[int] = FairQueue()
    queue.push(0, "stays", 1.0, 10)
    for i in range(1, 1000):
        queue.remove(queue.push(i, f"t{i}", 1.0, 10))
        queue.correct("stays", 1.0, 1)  # each re-tag leaves a stale entry too
    assert len(queue) == 1 and len(queue._heap) <= 2 + 32
    head = queue.pop()
    assert head is not None and head.item == 0 and queue.pop() is None
