"""How many replicas each autoscaled model should run, decided once an interval.

Pure: no I/O; the caller passes the time. For each deployment with `autoscale` in
cluster.yaml, from its demand (summed over every gateway: `demand_board`):

- **Estimate.** Arrival rate and service time are smoothed (an exponential moving
  average, half weight on the last interval); the larger of the smoothed and the last
  value is used, so a rise counts at once and a dip only once it lasts; an interval with
  no request at all (none arriving, waiting or running) leaves no demand behind.
- **Need.** `queueing_model.replicas_for`: the fewest replicas whose predicted p95 wait
  and utilization meet the targets, the requests waiting now counted as extra arrivals
  over one interval; within min_replicas..max_replicas.
- **Correct.** Measured time to first token above its target while requests wait: one
  more replica than now, whatever the model says (the model is wrong, or the replicas are
  slower than measured).
- **Up at once, down slowly.** More replicas are asked for as soon as they are needed,
  at most one change per model an interval; fewer only once the need stayed below the
  current count for `scale_down_after_s`, one replica at a time; but while GPUs are
  short (a replica waits for room, or the models want more than the fleet has) a
  model gives back all it does not need at once (`lent_back`): an idle share is lent,
  and returned within an interval when it is wanted. A model at zero that
  sees demand gets its first replica at once, interval or not (its requests are waiting).
- **Held down after a flap.** A rise within `flap_window_s` of a scale-down (the
  replica had to come back: a flap) doubles the quiet the next scale-down waits for:
  `scale_down_after_s` x 2, x 4, ..., at most `max(scale_down_after_s, flap_window_s)`;
  a scale-down that no rise follows within `flap_window_s` sets it back. Bursts that
  come back sooner than the wait keep the replica instead of loading it again and again.
- **Hold on missing data.** A model whose demand is missing or stale keeps its count:
  never scaled down on missing data.
- **Batch demand keeps, never adds.** For an online model (`serves: online`, the
  default) only the demand outside `autoscaling.batch_classes` (`Demand.online`) adds
  replicas, wakes a model at zero, or claims another model's GPUs; all of it counts
  towards keeping the replicas there are (reason `batch_demand` when only it does).

Which replica goes (the oldest that has run `min_runtime_s`), and whether the fleet has
room for what is asked (quotas, priorities, best fit), is placement's
(`gateway_control.placement.deployment`), not this module's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from gateway_control.cluster_config import Autoscale, Deployment
from gateway_control.placement.deployment import replica_pod
from gateway_control.placement.queueing_model import Demand, replicas_for

# The weight of the last interval in the moving averages.
SMOOTHING = 0.5


@dataclass(frozen=True, slots=True)
class ScaleDecision:
    """One model's decision this interval, with what it was made from (for the log)."""

    model: str
    current: int
    desired: int
    # What the queueing model asked for (bounded), before the rules on timing: for the
    # demand that may add replicas (for an online model, not the batch classes').
    needed: int
    # demand, ttft_target_missed, wake_from_zero, quiet, lent_back, steady, fleet_full,
    # waiting_to_scale_down, rate_limited, no_fresh_demand (and the autoscaler's
    # min_runtime and quota).
    reason: str
    arrival_rate: float | None = None
    service_s: float | None = None
    queued: float = 0
    ttft_p95_s: float | None = None
    # What all of the demand needs, batch classes too: replicas it keeps (None: `needed`).
    kept: int | None = None
    batch_rate: float = 0.0  # the batch classes' part of the last interval's arrival rate
    # The quiet a scale-down waits for now (scale_down_after_s, doubled by each flap).
    down_wait_s: float | None = None

    @property
    def direction(self) -> str:
        """up, down or none."""
        if self.desired > self.current:
            return "up"
        return "down" if self.desired < self.current else "none"


@dataclass(slots=True)
class _ModelState:
    arrival_rate: float | None = None
    online_rate: float | None = None  # the part that may add replicas, averaged alone
    service_s: float | None = None
    low_since: float | None = None
    needed_now: int = 0
    queued_up: float = 0  # requests waiting whose demand may add replicas
    changed_at: float | None = None
    # The last scale-down for quiet, while a rise within the flap window would make it a
    # flap; and the flaps since a scale-down last held (each doubles the wait).
    down_at: float | None = None
    flaps: int = 0
    # What the last decision changed of the above, for `held` to put back.
    before: tuple[float | None, float | None, int] | None = None


class ReplicaPlanner:
    """Decides the desired replicas of every autoscaled deployment, interval by interval."""

    def __init__(
        self, deployments: Sequence[Deployment], slots: Mapping[str, int], interval_s: float
    ) -> None:
        self._scaled: dict[str, Autoscale] = {
            d.model: d.autoscale for d in deployments if d.autoscale is not None
        }
        self._slots = {model: max(1, slots.get(model, 1)) for model in self._scaled}
        # What one replica of each takes of a GPU, in thousandths.
        self._size_milli = {
            d.model: replica_pod(d, 0).requested_milli for d in deployments if d.autoscale
        }
        self._interval_s = interval_s
        self._state = {model: _ModelState() for model in self._scaled}

    @property
    def models(self) -> list[str]:
        """The models it scales."""
        return list(self._scaled)

    def decide(
        self,
        now: float,
        current: Mapping[str, int],
        demand: Mapping[str, Demand | None],
        unplaced: Mapping[str, int] | None = None,
        room_milli: int | None = None,
    ) -> list[ScaleDecision]:
        """This interval's decision for each scaled model (`current`: its replicas
        wanted now; `demand`: its demand, None or absent when missing or stale;
        `unplaced`: per model, replicas waiting for room; `room_milli`: the GPU the
        scaled models share, in thousandths). When what they want does not fit, a
        replica wanted only as headroom (no request waits) is not asked for
        (`fleet_full`); when even what waiting requests claim does not fit, or a replica
        waits for room, models with more than they need give it back at once
        (`lent_back`). A model with replicas of its own waiting lends nothing."""
        needs = {
            model: self._need(model, scale, current.get(model, 0), demand.get(model))
            for model, scale in self._scaled.items()
        }
        waiting = {model for model, count in (unplaced or {}).items() if count > 0}
        # Short: what the models want does not fit, so a replica wanted as headroom
        # waits. Contended: even what requests that wait claim does not fit (or some
        # replica waits for room already), so the models with a surplus lend it.
        short = contended = bool(waiting)
        if room_milli is not None:
            size = self._size_milli
            wanted = sum(max(n.needed, n.current) * size[m] for m, n in needs.items())
            claimed = sum(
                (n.needed if n.needed > n.current and self._state[m].queued_up else n.current)
                * size[m]
                for m, n in needs.items()
            )
            short = short or wanted > room_milli
            contended = contended or claimed > room_milli
        decisions = []
        for model, need in needs.items():
            scale = self._scaled[model]
            lends = contended and model not in waiting
            state = self._state[model]
            window = scale.flap_window_s
            if state.down_at is not None and now - state.down_at > window:
                state.down_at, state.flaps = None, 0  # the scale-down held: no flap
            decision = self._timed(need, scale, now, lends, short)
            state.before = None
            if decision.direction != "none":
                state.before = (state.changed_at, state.down_at, state.flaps)
                state.changed_at = now
            if decision.direction == "up" and state.down_at is not None:
                state.down_at, state.flaps = None, state.flaps + 1  # a flap
            elif decision.reason == "quiet" and window > 0:
                state.down_at = now
            decisions.append(replace(decision, down_wait_s=self._down_wait(scale, state)))
        return decisions

    def held(self, model: str, *, changed: bool = False) -> None:
        """The last decision on `model` was not carried out (a minimum runtime or a
        quota held it): it counts neither as a change nor as a flap. `changed`: it was,
        but it took only replicas that were not placed (nothing was unloaded), so a
        rise after it is no flap."""
        state = self._state[model]
        if state.before is None:
            return
        changed_at, down_at, flaps = state.before
        if not changed:
            state.changed_at, state.flaps = changed_at, flaps
        state.down_at = down_at
        state.before = None

    @staticmethod
    def _down_wait(scale: Autoscale, state: _ModelState) -> float:
        """The quiet a scale-down of this model waits for now."""
        longest = max(scale.scale_down_after_s, scale.flap_window_s)
        return min(scale.scale_down_after_s * 2.0 ** min(state.flaps, 30), longest)

    def _need(
        self, model: str, scale: Autoscale, current: int, seen: Demand | None
    ) -> ScaleDecision:
        """What the demand asks for, before the rules on timing (`desired` = current)."""
        state = self._state[model]
        if seen is None:
            return ScaleDecision(model, current, current, current, "no_fresh_demand")
        demand = self._smoothed(state, seen)
        kept = self._replicas_for(demand, scale, model)
        # The demand that may add replicas: an online model's, without the batch classes.
        rising = seen.online if seen.online is not None and scale.serves == "online" else seen
        if rising is seen:
            needed = kept
        else:
            state.online_rate = _average(state.online_rate, rising)
            rate = max(rising.arrival_rate, state.online_rate)
            needed = self._replicas_for(
                replace(rising, arrival_rate=rate, service_s=demand.service_s), scale, model
            )
        state.queued_up = rising.queued
        # What the last interval alone needs: what a model keeps when GPUs are short
        # (batch demand yields then). Its service time is the one known so far when none
        # finished in the interval.
        state.needed_now = self._replicas_for(
            replace(rising, service_s=seen.service_s or demand.service_s), scale, model
        )
        reason = "demand"
        target = scale.targets.ttft_p95_s
        late = seen.ttft_p95_s is not None and target is not None and seen.ttft_p95_s > target
        if late and rising.queued > 0 and needed <= current < scale.max_replicas:
            needed, reason = current + 1, "ttft_target_missed"
        return ScaleDecision(
            model, current, current, needed, reason, demand.arrival_rate, demand.service_s,
            seen.queued, seen.ttft_p95_s, max(kept, needed),
            seen.arrival_rate - rising.arrival_rate,
        )  # fmt: skip

    def _replicas_for(self, demand: Demand, scale: Autoscale, model: str) -> int:
        needed = replicas_for(
            demand,
            self._slots[model],
            scale.targets.queue_wait_p95_s,
            scale.targets.utilization,
            backlog_horizon_s=self._interval_s,
        )
        return min(max(needed, scale.min_replicas), scale.max_replicas)

    def _timed(
        self, need: ScaleDecision, scale: Autoscale, now: float, lends: bool, short: bool
    ) -> ScaleDecision:
        """`need` under the rules on timing: up at once, down slowly (or at once to what
        the last interval needs when it `lends`: GPUs are short), one change an interval."""
        state = self._state[need.model]
        current, needed = need.current, need.needed
        if need.reason == "no_fresh_demand":
            state.low_since = None
            return need

        def decided(desired: int, why: str) -> ScaleDecision:
            return replace(need, desired=desired, reason=why)

        recently = state.changed_at is not None and now - state.changed_at < self._interval_s
        if needed > current:
            state.low_since = None
            if current == 0:
                return decided(needed, "wake_from_zero")
            if short and state.queued_up == 0:
                # GPUs are short: a replica is taken from another model only for requests
                # that wait, not for headroom the queueing model would like.
                return decided(current, "fleet_full")
            return decided(current, "rate_limited") if recently else decided(needed, need.reason)
        # Below what it has: what all of its demand (batch too) keeps.
        kept = need.needed if need.kept is None else need.kept
        needed = max(needed, kept)
        if lends and state.needed_now < needed:
            # Wanted elsewhere: judged on the last interval, not on a slow average.
            needed = state.needed_now
        if needed >= current:
            state.low_since = None
            # Held (or wanted higher) by the batch classes' demand alone: said so.
            return decided(current, "batch_demand" if kept > need.needed else "steady")
        if state.low_since is None:
            state.low_since = now
        quiet = now - state.low_since >= self._down_wait(scale, state)
        if not quiet and not lends:
            return decided(current, "waiting_to_scale_down")
        if recently:
            return decided(current, "rate_limited")
        if quiet:
            return decided(current - 1, "quiet")
        return replace(need, desired=needed, needed=needed, reason="lent_back")

    @staticmethod
    def _smoothed(state: _ModelState, seen: Demand) -> Demand:
        """`seen` with its rate and service time each the larger of the last value and
        the moving average (which it updates)."""
        rate = seen.arrival_rate
        state.arrival_rate = _average(state.arrival_rate, seen)
        service = seen.service_s
        if service > 0:  # none completed this interval: the service time is unknown
            state.service_s = (
                service
                if state.service_s is None
                else SMOOTHING * service + (1 - SMOOTHING) * state.service_s
            )
        known = state.service_s or 0.0
        return Demand(
            max(rate, state.arrival_rate),
            max(service, known),
            seen.queued,
            seen.in_flight,
            seen.ttft_p95_s,
        )


def _average(average: float | None, seen: Demand) -> float:
    """The moving average of the arrival rate, `seen` added (an idle interval, with
    nothing arriving, waiting or running, leaves no demand behind)."""
    rate = seen.arrival_rate
    idle = rate == 0 and seen.queued == 0 and seen.in_flight == 0
    if average is None or idle:
        return rate
    return SMOOTHING * rate + (1 - SMOOTHING) * average
