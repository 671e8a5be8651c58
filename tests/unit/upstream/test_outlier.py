"""Outlier ejection: pure logic, with a fake clock."""

from __future__ import annotations

import pytest

from gateway.upstream.outlier import OutlierDetector, ReplicaState
from gateway.upstream.pool import Replica, ReplicaPool
from tests.fake_clock import FakeClock

# -- outlier ejection -------------------------------------------------------------------


def detector(
    pool: ReplicaPool, clock: FakeClock, failures: int = 3, base: float = 5.0, cap: float = 60.0
) -> OutlierDetector:
    return OutlierDetector(failures, base, cap, clock, replicas=pool.replicas)


def fail(det: OutlierDetector, replica: Replica, times: int = 1) -> None:
    for _ in range(times):
        det.record_failure(replica)


def routable(pool: ReplicaPool, det: OutlierDetector) -> list[str]:
    """What a router using `available` would consider, as ReplicaPool.pick filters."""
    return [r.url for r in pool.replicas if r.healthy and det.available(r)]


def test_ejects_after_consecutive_failures_only() -> None:
    clock = FakeClock()
    pool = ReplicaPool(["a", "b"])
    a, _ = pool.replicas
    det = detector(pool, clock)
    fail(det, a, 2)
    det.record_success(a)  # breaks the run
    fail(det, a, 2)
    assert det.available(a) and det.state(a) is ReplicaState.IN_SERVICE
    fail(det, a)
    assert det.state(a) is ReplicaState.EJECTED
    assert routable(pool, det) == ["b"]
    assert det.eligible(pool.replicas) == [pool.replicas[1]]


def test_cool_down_then_a_single_half_open_probe() -> None:
    clock = FakeClock()
    pool = ReplicaPool(["a", "b"])
    a, _ = pool.replicas
    det = detector(pool, clock)
    fail(det, a, 3)
    clock.advance(4.9)
    assert not det.available(a)
    clock.advance(0.1)
    assert det.state(a) is ReplicaState.HALF_OPEN
    assert routable(pool, det) == ["a", "b"]
    with pool.lease(a):  # the probe is sent
        assert not det.available(a)
        assert routable(pool, det) == ["b"]
        det.record_success(a)
    assert det.state(a) is ReplicaState.IN_SERVICE
    assert det.available(a)


def test_a_failed_probe_doubles_the_cool_down_up_to_the_max() -> None:
    clock = FakeClock()
    pool = ReplicaPool(["a", "b"])
    a, _ = pool.replicas
    det = detector(pool, clock, base=5.0, cap=15.0)
    fail(det, a, 3)
    for cool_down in (5.0, 10.0, 15.0, 15.0):
        clock.advance(cool_down - 0.01)
        assert not det.available(a)
        clock.advance(0.01)
        assert det.available(a)
        with pool.lease(a):
            fail(det, a)  # the probe fails: ejected again, one failure is enough
        assert det.state(a) is ReplicaState.EJECTED


def test_a_success_resets_the_doubling() -> None:
    clock = FakeClock()
    pool = ReplicaPool(["a", "b"])
    a, _ = pool.replicas
    det = detector(pool, clock, base=5.0)
    fail(det, a, 3)
    clock.advance(5)
    fail(det, a)  # half-open failure: 10 s now
    clock.advance(10)
    det.record_success(a)
    assert det.state(a) is ReplicaState.IN_SERVICE
    fail(det, a, 3)
    clock.advance(5)  # back to the base cool-down
    assert det.state(a) is ReplicaState.HALF_OPEN


def test_outcomes_during_the_cool_down_change_nothing() -> None:
    clock = FakeClock()
    pool = ReplicaPool(["a", "b"])
    a, _ = pool.replicas
    det = detector(pool, clock, base=5.0)
    fail(det, a, 3)
    clock.advance(1)
    det.record_success(a)  # a request sent before the ejection
    fail(det, a, 10)
    assert det.state(a) is ReplicaState.EJECTED
    clock.advance(4)
    assert det.state(a) is ReplicaState.HALF_OPEN  # neither cut short nor extended


def test_a_probe_cancelled_without_outcome_frees_the_slot() -> None:
    clock = FakeClock()
    pool = ReplicaPool(["a", "b"])
    a, _ = pool.replicas
    det = detector(pool, clock)
    fail(det, a, 3)
    clock.advance(5)
    assert det.available(a)
    with pool.lease(a):
        assert not det.available(a)
    # The request ended (cancelled) without reporting: the next one may probe.
    assert det.available(a)
    with pool.lease(a):
        fail(det, a)
    assert det.state(a) is ReplicaState.EJECTED


def test_requests_already_in_flight_do_not_block_the_probe() -> None:
    clock = FakeClock()
    pool = ReplicaPool(["a", "b"])
    a, _ = pool.replicas
    det = detector(pool, clock)
    with pool.lease(a):  # a slow request, in flight through the whole ejection
        fail(det, a, 3)
        clock.advance(5)
        assert det.available(a)
        with pool.lease(a):
            assert not det.available(a)
        # The probe ended without outcome while the slow one still runs: still one at a time.
        assert not det.available(a)
    assert det.available(a)


def test_panic_mode_uses_the_replica_back_soonest_and_only_it() -> None:
    clock = FakeClock()
    pool = ReplicaPool(["a", "b", "c"])
    a, b, c = pool.replicas
    det = detector(pool, clock, base=5.0)
    fail(det, b, 3)
    clock.advance(1)
    fail(det, a, 3)
    # c is still in service: no ejected replica gets a request.
    assert routable(pool, det) == ["c"]
    fail(det, c, 3)
    # All ejected: b's cool-down ends first.
    assert routable(pool, det) == ["b"]
    assert det.eligible(pool.replicas) == [b]
    # A replica that fails the active check does not count as healthy, nor panic-route.
    b.healthy = False
    assert routable(pool, det) == ["a"]
    assert det.eligible(pool.replicas) == [a]
    b.healthy = True
    # As soon as a replica is back (half-open, probe slot free), panic ends.
    clock.advance(4)
    assert det.state(b) is ReplicaState.HALF_OPEN
    assert routable(pool, det) == ["b"]
    det.record_success(b)
    assert routable(pool, det) == ["b"]


def test_without_replicas_the_detector_never_panics() -> None:
    clock = FakeClock()
    pool = ReplicaPool(["a"])
    (a,) = pool.replicas
    det = OutlierDetector(1, 5.0, 60.0, clock)
    fail(det, a)
    assert not det.available(a)
    # eligible() knows its candidates, so it can.
    assert det.eligible([a]) == [a]
    a.healthy = False
    assert det.eligible([a]) == []


def test_outlier_detector_rejects_bad_settings() -> None:
    with pytest.raises(ValueError):
        OutlierDetector(0, 5.0, 60.0)
    with pytest.raises(ValueError):
        OutlierDetector(3, 10.0, 5.0)
    with pytest.raises(ValueError):
        OutlierDetector(3, 0.0, 5.0)


def test_ejection_and_return_are_reported() -> None:
    clock = FakeClock()
    pool = ReplicaPool(["a", "b"])
    a, _ = pool.replicas
    det = detector(pool, clock, failures=2, base=5.0)
    changes: list[tuple[str, float | None]] = []
    det.on_change = lambda replica: changes.append((replica.url, det.cooldown_end(replica)))
    fail(det, a)
    det.record_success(a)  # in service all along: nothing to report
    assert changes == [] and det.cooldown_end(a) is None
    fail(det, a, 2)
    assert changes == [("a", 1005.0)]
    fail(det, a)  # during the cool-down: no change
    clock.advance(5.0)
    fail(det, a)  # the half-open probe failed: ejected again, for twice as long
    assert changes[-1] == ("a", 1015.0)
    clock.advance(10.0)
    det.record_success(a)  # back in service
    assert changes[-1] == ("a", None) and len(changes) == 3


# -- doubtful failures (a long prompt's late first token) ------------------------------


def test_doubtful_failures_never_eject_a_replica_with_a_clean_slate() -> None:
    clock = FakeClock()
    pool = ReplicaPool(["a", "b"])
    a, _ = pool.replicas
    det = detector(pool, clock, failures=1)
    for _ in range(100):
        det.record_failure(a, doubtful=True)
    assert det.state(a) is ReplicaState.IN_SERVICE


def test_doubtful_failures_count_against_a_replica_failing_already() -> None:
    clock = FakeClock()
    pool = ReplicaPool(["a", "b"])
    a, _ = pool.replicas
    det = detector(pool, clock, failures=3)
    fail(det, a)
    det.record_failure(a, doubtful=True)
    det.record_failure(a, doubtful=True)
    assert det.state(a) is ReplicaState.EJECTED
    clock.advance(5.0)  # half-open: the probe's doubtful failure ejects it again
    det.record_failure(a, doubtful=True)
    assert det.state(a) is ReplicaState.EJECTED
    clock.advance(10.0)
    det.record_success(a)
    det.record_failure(a, doubtful=True)  # a success wiped the slate
    det.record_failure(a, doubtful=True)
    det.record_failure(a, doubtful=True)
    assert det.state(a) is ReplicaState.IN_SERVICE
