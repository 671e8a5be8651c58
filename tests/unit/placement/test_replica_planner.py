"""The closed loop's decisions, interval by interval: up at once when demand rises, down
one replica at a time only after demand stayed low, never on missing data, at most one
change per model an interval, within min and max, and a model at zero woken at once."""

from __future__ import annotations

import itertools
from typing import Any

from gateway_control.cluster_config import Deployment
from gateway_control.placement.queueing_model import Demand
from gateway_control.placement.replica_planner import ReplicaPlanner, ScaleDecision

INTERVAL = 10.0


def deployment(model: str = "llm", **autoscale: Any) -> Deployment:
    scale = {"min_replicas": 1, "max_replicas": 6, "scale_down_after_s": 60, **autoscale}
    return Deployment.model_validate({"model": model, "replicas": 1, "autoscale": scale})


def planner(*deployments: Deployment) -> ReplicaPlanner:
    return ReplicaPlanner(deployments, {d.model: 4 for d in deployments}, INTERVAL)


def one(p: ReplicaPlanner, now: float, current: int, demand: Demand | None) -> ScaleDecision:
    return p.decide(now, {"llm": current}, {"llm": demand})[0]


BUSY = Demand(arrival_rate=8.0, service_s=1.0, queued=20, in_flight=4)
QUIET = Demand(arrival_rate=0.2, service_s=1.0)


def test_a_rise_in_demand_scales_up_at_once_within_max() -> None:
    p = planner(deployment())
    decision = one(p, 0.0, 1, BUSY)
    assert decision.direction == "up" and decision.reason == "demand"
    assert 3 <= decision.desired <= 6
    flood = Demand(arrival_rate=1000.0, service_s=1.0, queued=500)
    assert one(p, 100.0, decision.desired, flood).desired == 6  # max_replicas


def test_at_most_one_change_per_model_an_interval() -> None:
    p = planner(deployment())
    first = one(p, 0.0, 1, Demand(2.0, 1.0))
    assert first.direction == "up"
    surge = one(p, 5.0, first.desired, Demand(1000.0, 1.0, queued=100))
    assert (surge.direction, surge.reason) == ("none", "rate_limited")
    assert one(p, 10.0, first.desired, Demand(1000.0, 1.0, queued=100)).direction == "up"


def test_quiet_scales_down_only_after_it_lasted_and_one_replica_at_a_time() -> None:
    p = planner(deployment())
    now, current = 0.0, 4
    seen = []
    while now <= 200:
        decision = one(p, now, current, QUIET)
        seen.append((now, decision.reason))
        current = decision.desired
        now += INTERVAL
    downs = [t for t, reason in seen if reason == "quiet"]
    assert downs[0] >= 60  # scale_down_after_s
    assert all(b - a >= INTERVAL for a, b in itertools.pairwise(downs))
    assert current == 1 and len(downs) == 3  # min_replicas, one step at a time


def test_a_burst_in_the_quiet_starts_the_wait_again() -> None:
    p = planner(deployment())
    for now in (0.0, 10.0, 20.0, 30.0, 40.0):
        assert one(p, now, 3, QUIET).reason == "waiting_to_scale_down"
    assert one(p, 50.0, 3, Demand(8.0, 1.0)).reason in ("steady", "demand")
    assert one(p, 60.0, 3, QUIET).reason == "waiting_to_scale_down"


def test_missing_or_stale_demand_holds_the_count() -> None:
    p = planner(deployment())
    for now in (0.0, 100.0, 200.0, 300.0):
        decision = one(p, now, 4, None)
        assert (decision.desired, decision.reason) == (4, "no_fresh_demand")


def test_a_model_at_zero_gets_its_first_replica_at_once() -> None:
    p = planner(deployment(min_replicas=0, scale_down_after_s=20))
    current = one(p, 0.0, 1, Demand(5.0, 1.0)).desired  # busy once: its average decays
    for now in (10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0, 110.0, 120.0):
        current = one(p, now, current, Demand(0.0, 1.0)).desired
    assert current == 0
    woken = one(p, 41.0, 0, Demand(0.0, 0.0, queued=1))  # one request waits
    assert (woken.desired, woken.reason) == (1, "wake_from_zero")


def test_time_to_first_token_over_its_target_adds_a_replica() -> None:
    p = planner(deployment(targets={"ttft_p95_s": 1.0, "queue_wait_p95_s": 30}))
    late = Demand(arrival_rate=1.0, service_s=1.0, queued=3, ttft_p95_s=4.0)
    decision = one(p, 0.0, 2, late)
    assert (decision.desired, decision.reason) == (3, "ttft_target_missed")


def test_models_are_decided_apart() -> None:
    p = planner(deployment("a"), deployment("b"))
    decisions = p.decide(0.0, {"a": 1, "b": 3}, {"a": BUSY, "b": QUIET})
    assert [(d.model, d.direction) for d in decisions] == [("a", "up"), ("b", "none")]


def test_while_gpus_are_short_a_surplus_is_lent_back_at_once_and_headroom_waits() -> None:
    lender, taker = deployment("lender"), deployment("taker")
    p = ReplicaPlanner([lender, taker], {"lender": 4, "taker": 4}, INTERVAL)
    # Each is at 2 replicas of 4 slots; the fleet has room for 4 replicas in all.
    room = 4 * 1000
    steady = Demand(arrival_rate=3.0, service_s=1.0)
    calm = p.decide(0.0, {"lender": 2, "taker": 2}, {"lender": steady, "taker": steady}, None, room)
    assert [d.direction for d in calm] == ["none", "none"]
    # Demand moves: the taker has requests waiting, the lender needs one replica.
    moved = {"lender": Demand(0.2, 1.0), "taker": Demand(12.0, 1.0, queued=30, in_flight=8)}
    lent, took = p.decide(INTERVAL, {"lender": 2, "taker": 2}, moved, None, room)
    assert (took.direction, took.reason) == ("up", "demand")
    # Not after scale_down_after_s (60 s): now, because what they want exceeds the room.
    assert (lent.desired, lent.reason) == (1, "lent_back")
    # A replica the taker's queueing model would like as headroom, with nothing waiting,
    # is not taken from another model while the fleet is full.
    headroom = {"lender": steady, "taker": Demand(3.5, 1.0)}
    held = p.decide(100.0, {"lender": 2, "taker": 2}, headroom, None, room)
    assert held[1].reason == "fleet_full" and held[1].desired == 2


def test_a_lender_keeps_the_replicas_its_running_streams_hold() -> None:
    lender, taker = deployment("lender"), deployment("taker")
    p = ReplicaPlanner([lender, taker], {"lender": 4, "taker": 4}, INTERVAL)
    room = 4 * 1000
    steady = Demand(arrival_rate=3.0, service_s=1.0)
    p.decide(0.0, {"lender": 2, "taker": 2}, {"lender": steady, "taker": steady}, None, room)
    # The lender's 7 streams run on, none finished this interval (no service time seen),
    # while the taker's requests wait: it gives back nothing its streams hold.
    streaming = Demand(0.1, 0.0, in_flight=7)
    moved = {"lender": streaming, "taker": Demand(12.0, 1.0, queued=30, in_flight=8)}
    lent, _ = p.decide(INTERVAL, {"lender": 2, "taker": 2}, moved, None, room)
    assert lent.desired == 2
    # With no service time ever seen, the same: its streams' slots are kept.
    fresh = ReplicaPlanner([lender, taker], {"lender": 4, "taker": 4}, INTERVAL)
    lent, _ = fresh.decide(0.0, {"lender": 2, "taker": 2}, moved, None, room)
    assert lent.desired == 2


def test_a_model_whose_own_replicas_wait_for_room_lends_nothing() -> None:
    a, b = deployment("a"), deployment("b")
    p = ReplicaPlanner([a, b], {"a": 4, "b": 4}, INTERVAL)
    low = Demand(0.2, 1.0)
    # a wants 3 of which one is unplaced; its demand fell, yet it is not a lender.
    decisions = p.decide(0.0, {"a": 3, "b": 1}, {"a": low, "b": low}, {"a": 1})
    assert decisions[0].reason == "waiting_to_scale_down"


def batch(rate: float, queued: float = 0, in_flight: int = 0, online: float = 0.0) -> Demand:
    """Demand whose online part is `online` requests a second, the rest batch."""
    return Demand(
        rate + online, 1.0, queued, in_flight, online=Demand(online, 1.0)
    )  # fmt: skip


def test_batch_demand_never_raises_an_online_models_desired_count() -> None:
    p = planner(deployment(min_replicas=0))
    current, now = 1, 0.0
    # Bursts of batch work (up to 400 choices waiting) and quiet, interval after interval.
    for rate, queued in [(115.0, 128), (0.0, 0), (400.0, 400), (40.0, 10)] * 10:
        decision = one(p, now, current, batch(rate, queued, in_flight=4))
        assert decision.desired <= current
        assert decision.reason in ("batch_demand", "steady")
        current, now = decision.desired, now + INTERVAL
    # Nor does it wake a model at zero: only its online requests do.
    at_zero = one(p, now, 0, batch(50.0, 30))
    assert (at_zero.desired, at_zero.reason) == (0, "batch_demand")
    woken = one(p, now + INTERVAL, 0, batch(50.0, 30, online=1.0))
    assert (woken.direction, woken.reason) == ("up", "wake_from_zero")


def test_batch_demand_keeps_an_online_models_replicas_from_going() -> None:
    p = planner(deployment())
    # 3 replicas of 4 slots; online demand has gone, batch work fills two replicas' worth
    # (5 slots busy, at the 0.75 target). The third goes once it was low a minute...
    current, now, seen = 3, 0.0, []
    while now < 900:
        decision = one(p, now, current, batch(5.0, in_flight=5))
        seen.append(decision.reason)
        current, now = decision.desired, now + INTERVAL
    assert seen.count("quiet") == 1
    # ...and the two the batch work fills stay, however long it lasts.
    assert current == 2 and seen[-1] == "batch_demand"


def test_online_demand_among_batch_scales_up_at_once() -> None:
    p = planner(deployment())
    decision = one(p, 0.0, 1, batch(100.0, 100, online=12.0))
    assert decision.direction == "up" and decision.reason == "demand"
    assert decision.kept is not None and decision.kept >= decision.desired


def test_a_model_that_serves_batch_is_scaled_by_batch_demand() -> None:
    p = planner(deployment(serves="batch"))
    decision = one(p, 0.0, 1, batch(12.0, 10))
    assert decision.direction == "up" and decision.reason == "demand"


def test_batch_requests_waiting_claim_no_gpu_of_another_model() -> None:
    lender, taker = deployment("lender"), deployment("taker")
    p = ReplicaPlanner([lender, taker], {"lender": 4, "taker": 4}, INTERVAL)
    room = 4 * 1000
    steady = Demand(arrival_rate=3.0, service_s=1.0)
    p.decide(0.0, {"lender": 2, "taker": 2}, {"lender": steady, "taker": steady}, None, room)
    # Only batch work waits on the taker: the lender lends nothing for it.
    moved = {"lender": Demand(0.2, 1.0), "taker": batch(12.0, 30, in_flight=8)}
    lent, took = p.decide(INTERVAL, {"lender": 2, "taker": 2}, moved, None, room)
    assert took.desired == 2 and lent.reason == "waiting_to_scale_down"


BURST = Demand(arrival_rate=100.0, service_s=1.0, queued=128, in_flight=8)


def replay(p: ReplicaPlanner, seen: Any, seconds: float, current: int = 1) -> list[float]:
    """Decide every interval for `seconds` on `seen(now)`'s demand (changes carried
    out); when the changes were."""
    changes, now = [], 0.0
    while now < seconds:
        decision = one(p, now, current, seen(now))
        if decision.direction != "none":
            changes.append(now)
        current, now = decision.desired, now + INTERVAL
    return changes


def bursts(now: float) -> Demand:
    """One interval of a burst every 150 s, quiet between (its average decays in 50 s)."""
    return BURST if now % 150 == 0 else QUIET


def test_bursts_that_come_back_flap_once_and_are_then_held() -> None:
    p = planner(deployment(max_replicas=2, scale_down_after_s=60))
    changes = replay(p, bursts, 1800)
    # Up, down after a minute of quiet, up at the next burst (a flap): the next
    # scale-down waits 2 minutes, and the bursts come back before it is over.
    assert len(changes) == 3


def test_without_the_flap_rule_the_same_bursts_flap_all_along() -> None:
    p = planner(deployment(max_replicas=2, scale_down_after_s=60, flap_window_s=0))
    assert len(replay(p, bursts, 1800)) == 24  # up and down every 150 s


def test_each_flap_doubles_the_wait_up_to_the_window_and_a_scale_down_that_holds_resets_it() -> (
    None
):
    p = planner(deployment(max_replicas=2, scale_down_after_s=60, flap_window_s=300))
    waits = []
    now, current = 0.0, 1
    for burst_at in (0, 200, 400, 800, 1800):
        while now < burst_at:
            decision = one(p, now, current, QUIET)
            current, now = decision.desired, now + INTERVAL
        decision = one(p, now, current, BURST)
        assert (decision.direction, decision.reason) == ("up", "demand")  # at once, always
        waits.append(decision.down_wait_s)
        current, now = decision.desired, now + INTERVAL
    # 60 s at first; doubled by each return within the window of a scale-down, at most
    # the window's 300 s; the burst at 1800 came when the last scale-down had held for
    # longer than the window: the wait is set back.
    assert waits == [60, 120, 240, 300, 60]


def test_a_scale_down_held_by_a_minimum_runtime_starts_no_flap() -> None:
    p = planner(deployment(max_replicas=2, scale_down_after_s=60))
    current, held = 1, 0
    for now in range(0, 200, int(INTERVAL)):
        decision = one(p, float(now), current, BURST if now == 0 else QUIET)
        if decision.direction == "down":
            p.held("llm")  # the autoscaler kept the replica: too young
            held += 1
            continue
        current = decision.desired
    assert current == 2 and held > 0
    rise = one(p, 200.0, 2, BURST)
    assert (rise.direction, rise.down_wait_s) == ("none", 60)  # no flap counted
    # The same scale-down carried out: the rise after it is a flap.
    assert one(p, 210.0, 2, QUIET).direction == "none"  # the wait starts again
    at = 220.0
    while one(p, at, 2, QUIET).direction != "down":
        at += INTERVAL
    assert one(p, at + INTERVAL, 1, BURST).down_wait_s == 120


def test_sustained_demand_after_flaps_still_scales_up_at_once() -> None:
    p = planner(deployment(max_replicas=4, scale_down_after_s=60))
    replay(p, bursts, 400)
    # The flaps lengthened the wait to scale down; a rise is as prompt as ever.
    steady_rise = Demand(arrival_rate=9.0, service_s=1.0, queued=2, in_flight=8)
    decision = one(p, 400.0, 2, steady_rise)
    assert (decision.direction, decision.reason) == ("up", "demand")
    assert decision.down_wait_s is not None and decision.down_wait_s > 60


def test_a_scale_down_of_replicas_never_placed_starts_no_flap() -> None:
    p = planner(deployment(max_replicas=2, scale_down_after_s=60))
    now, current = 0.0, 2
    while one(p, now, current, QUIET).direction != "down":
        now += INTERVAL
    p.held("llm", changed=True)  # it took a replica that was waiting for room
    rise = one(p, now + INTERVAL, 1, BURST)
    assert (rise.direction, rise.down_wait_s) == ("up", 60)
