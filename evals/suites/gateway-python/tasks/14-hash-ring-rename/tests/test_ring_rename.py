import inspect

import pytest

from routing import rebalance, ring, router
from routing.rebalance import moved_keys
from routing.ring import HashRing
from routing.router import StickyRouter

NODES = ["triton-a", "triton-b", "triton-c"]
SESSIONS = [f"session-{i}" for i in range(1, 7)]


def test_node_for_keeps_placement() -> None:
    hash_ring = HashRing(NODES)
    assert {key: hash_ring.node_for(key) for key in SESSIONS} == {
        "session-1": "triton-b",
        "session-2": "triton-b",
        "session-3": "triton-b",
        "session-4": "triton-a",
        "session-5": "triton-a",
        "session-6": "triton-c",
    }


def test_node_for_on_empty_ring() -> None:
    with pytest.raises(LookupError):
        HashRing().node_for("session-1")
    hash_ring = HashRing(["only"])
    hash_ring.remove_node("only")
    with pytest.raises(LookupError):
        hash_ring.node_for("session-1")


def test_old_name_is_gone() -> None:
    assert not hasattr(HashRing, "get_node")
    assert not hasattr(HashRing(NODES), "get_node")
    for module in (ring, router, rebalance):
        assert "get_node" not in inspect.getsource(module)


def test_sticky_router_unchanged() -> None:
    sticky = StickyRouter(HashRing(NODES))
    assert {key: sticky.route(key, set(NODES)) for key in SESSIONS} == {
        "session-1": "triton-b",
        "session-2": "triton-b",
        "session-3": "triton-b",
        "session-4": "triton-a",
        "session-5": "triton-a",
        "session-6": "triton-c",
    }
    assert {key: sticky.route(key, {"triton-a", "triton-c"}) for key in SESSIONS} == {
        "session-1": "triton-a",
        "session-2": "triton-c",
        "session-3": "triton-c",
        "session-4": "triton-a",
        "session-5": "triton-a",
        "session-6": "triton-c",
    }
    with pytest.raises(LookupError):
        sticky.route("session-1", set())


def test_moved_keys_unchanged() -> None:
    before = HashRing(NODES)
    after = HashRing([*NODES, "triton-d"])
    keys = [f"session-{i}" for i in range(20)]
    assert moved_keys(before, after, keys) == {
        "session-1": ("triton-b", "triton-d"),
        "session-13": ("triton-b", "triton-d"),
        "session-17": ("triton-c", "triton-d"),
    }
    assert moved_keys(before, HashRing(NODES), keys) == {}
