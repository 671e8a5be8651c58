"""Replica choice: the healthy replica with the fewest outstanding requests."""

from __future__ import annotations

import pytest

from gateway.upstream.pool import ReplicaPool


def test_picks_the_least_loaded_healthy_replica() -> None:
    pool = ReplicaPool(["a", "b", "c"])
    a, b, c = pool.replicas
    a.outstanding, b.outstanding, c.outstanding = 3, 1, 2
    assert pool.pick() is b
    b.healthy = False
    assert pool.pick() is c


def test_equal_load_is_spread_in_turn() -> None:
    pool = ReplicaPool(["a", "b"])
    picked = []
    for _ in range(4):
        replica = pool.pick()
        assert replica is not None
        with pool.lease(replica):
            picked.append(replica.url)
    assert picked == ["a", "b", "a", "b"]


def test_excluded_unhealthy_and_unavailable_replicas_are_never_picked() -> None:
    pool = ReplicaPool(["a", "b", "c"])
    a, b, c = pool.replicas
    assert pool.pick(exclude=[a]) is b
    pool.mark_checked(b, healthy=False)
    assert pool.pick(exclude=[a]) is c
    assert pool.pick(exclude=[a], available=lambda r: r is not c) is None
    assert pool.ready
    pool.mark_checked(a, healthy=False)
    pool.mark_checked(c, healthy=False)
    assert not pool.ready
    pool.mark_checked(a, healthy=True)
    assert pool.pick() is a


def test_a_lease_is_released_when_the_request_fails() -> None:
    pool = ReplicaPool(["a"])
    (a,) = pool.replicas
    with pytest.raises(RuntimeError), pool.lease(a):
        assert a.outstanding == 1
        raise RuntimeError("upstream failed")
    assert a.outstanding == 0


def test_other_clients_queue_on_a_replica_counts_as_load() -> None:
    pool = ReplicaPool(["a", "b"])
    a, b = pool.replicas
    b.outstanding = 2
    a.upstream_pending = 5  # queued in Triton by other clients
    assert (a.external, a.load) == (5, 5)
    assert pool.pick() is b
    a.outstanding = 5  # the pending ones are the gateway's own: no double count
    assert (a.external, a.load) == (0, 5)


def test_at_equal_load_the_replica_whose_triton_queue_was_quicker_goes_first() -> None:
    pool = ReplicaPool(["a", "b"])
    a, b = pool.replicas
    a.upstream_delay_steps, b.upstream_delay_steps = 5, 0  # 50 ms against under 10 ms
    assert [pool.pick(), pool.pick()] == [b, b]
    b.outstanding = 1  # load comes first
    assert pool.pick() is a


def test_pick_leaves_out_replicas_at_their_cap() -> None:
    pool = ReplicaPool(["a", "b"])
    a, b = pool.replicas
    a.outstanding, b.outstanding = 2, 2
    assert pool.pick(max_in_flight=2) is None
    assert pool.pick() is a
    b.outstanding = 1
    assert pool.pick(max_in_flight=2) is b


def test_a_replica_taken_out_with_requests_on_it_is_draining_until_they_end() -> None:
    pool = ReplicaPool(["http://a", "http://b"])
    leaving = next(r for r in pool.replicas if r.url == "http://b")
    with pool.lease(leaving):
        pool.set_urls(["http://a"])
        assert [r.url for r in pool.replicas] == ["http://a"]
        assert pool.draining() == {"http://b": 1}
    assert pool.draining() == {}
    # Put back while a request is still on it: the same replica, its count kept.
    again = next(r for r in [*pool.replicas] if r.url == "http://a")
    with pool.lease(again):
        pool.set_urls(["http://b"])
        pool.set_urls(["http://a", "http://b"])
        assert next(r for r in pool.replicas if r.url == "http://a").outstanding == 1
        assert pool.draining() == {}
