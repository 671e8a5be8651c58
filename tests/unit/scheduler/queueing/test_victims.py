"""gateway_control.scheduler.queueing.victims: victim order and the minimal victim set."""

from __future__ import annotations

from gateway_control.scheduler.queueing.victims import select_victims, victim_key


def test_victim_key_order() -> None:
    # (name, tenant borrowing, priority, start order)
    candidates = [("own-low", False, 0, 5), ("old", True, 5, 1), ("young", True, 5, 3)]
    candidates.append(("low", True, 1, 0))
    ordered = sorted(candidates, key=lambda c: victim_key(c[1], c[2], c[3]))
    assert [c[0] for c in ordered] == ["low", "young", "old", "own-low"]


def test_select_victims_is_minimal() -> None:
    # Freed GPU must reach 4: greedy takes 1, 2, 2 (5); giving back v2 leaves 3, too few,
    # but giving back v1 leaves 4.
    sizes = {"v1": 1, "v2": 2, "v3": 2, "v4": 1}
    state = {"free": 0}

    def take(v: str) -> None:
        state["free"] += sizes[v]

    def give_back(v: str) -> None:
        state["free"] -= sizes[v]

    victims = select_victims(
        ["v1", "v2", "v3", "v4"], lambda v: True, take, give_back, lambda: state["free"] >= 4
    )
    assert victims == ["v2", "v3"] and state["free"] == 4
    state["free"] = 0
    assert select_victims(["v1"], lambda v: True, take, give_back, lambda: False) is None
    assert state["free"] == 0  # trials undone
