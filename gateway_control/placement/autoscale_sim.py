"""`gateway simulate autoscale`: the closed loop tried offline on a trace of arrivals.

The same code decides as on the leader: the `Autoscaler`'s `decide` (the queueing
model, the timing rules, minimum runtimes) and placement's `plan_deployments`
(priorities, best fit, reclaiming). What stands in for the fleet is small and stated:

- A model's capacity is `slots_per_replica` requests at once per node that runs a ready
  replica of it (the gateway's admission does exactly this: one endpoint per node).
- A request holds its slot for its `service_s` (its model's, unless the trace says) and
  has its first token `prefill_s` after it gets one; it waits for at most `max_wait_s`,
  and is refused then (the gateway's queue timeout). The queue is the admission's, in
  short: online before batch, first come first served within a class, at most the
  model's `max_queued` waiting (an online arrival sheds the newest batch request; any
  other arrival is refused at once, and still counted as demand).
- A request with `n` choices is `n` requests (the gateway admits each choice apart).
- A replica placed is ready `load_s` later (Triton's load); a replica removed takes no
  new request at once and holds its GPU for one more `service_s` (its drain).
- Each interval the loop sees what one gateway would report (`demand_board`): its
  admission's counters (arrivals, the tokens they reserved, completions, busy seconds)
  and what waits and runs, per class, and the TTFT p95; read as the leader reads it.

Static placement is the same run with each deployment's `replicas` fixed. Pure: no I/O,
no clock; `run_policy` returns the figures and a timeline (for the chart).
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gateway_control.cluster_config import ClusterConfig
from gateway_control.placement.autoscaler import Autoscaler
from gateway_control.placement.demand_board import ClassReport, GatewayReport, ModelReport
from gateway_control.placement.deployment import DeploymentPlan, plan_deployments, replica_pod
from gateway_control.scheduler.cluster import GPU_MILLI

# The simulation's step, seconds: fine against a service time of a second.
STEP_S = 0.01


# The admission's priority classes (its default), highest first.
CLASSES = ("online", "batch")


@dataclass(frozen=True, slots=True)
class Phase:
    """A stretch of the trace: requests a second per model, Poisson arrivals; with
    `ramp_to`, each model's rate goes in a straight line from `rates` to `ramp_to` over
    the phase."""

    name: str
    seconds: float
    rates: Mapping[str, float]
    priority: str = "online"
    ramp_to: Mapping[str, float] | None = None


@dataclass(frozen=True, slots=True)
class Burst:
    """`requests` requests at once, every `every_s` from `start_s` on: spread evenly over
    `spread_s`, each with `n` choices (`n` requests to admission), of one priority."""

    name: str
    model: str
    every_s: float
    requests: int
    n: int = 1
    spread_s: float = 0.0
    start_s: float = 0.0
    priority: str = "online"
    service_s: float | None = None  # each choice's; None: its model's
    cost_tokens: int | None = None  # what the gateway reserves for each; None: its model's


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """How one model's requests behave (as measured on the demo's replicas)."""

    service_s: float  # the slot is held this long
    prefill_s: float  # the first token comes this long after the slot
    ttft_target_s: float  # the SLO: a request is within it when its TTFT is at most this
    cost_tokens: int = 100  # what the gateway reserves for a request (prompt + max_tokens)
    max_queued: int | None = None  # the admission queue's bound; None: no bound


@dataclass(frozen=True, slots=True)
class SimRequest:
    """One request to admission: when, to what, of which class, and what it costs."""

    t: float
    model: str
    priority: str
    service_s: float
    cost_tokens: int


@dataclass(frozen=True, slots=True)
class Workload:
    """Phases of demand over models, and bursts, with a seed: the same arrivals for
    every policy."""

    phases: Sequence[Phase]
    profiles: Mapping[str, ModelProfile]
    seed: int = 0
    bursts: Sequence[Burst] = ()

    @property
    def seconds(self) -> float:
        """The trace's length."""
        return sum(phase.seconds for phase in self.phases)

    def arrivals(self) -> list[tuple[float, str]]:
        """Every request as (seconds from the start, model), in time order."""
        return sorted((r.t, r.model) for r in self.requests())

    def requests(self) -> list[SimRequest]:
        """Every request, in time order (the phases' Poisson arrivals, then the bursts)."""
        rng = random.Random(self.seed)
        found = []
        start = 0.0
        for phase in self.phases:
            for model, rate in sorted(phase.rates.items()):
                profile = self.profiles[model]
                end_rate = rate if phase.ramp_to is None else phase.ramp_to.get(model, rate)
                for t in _poisson(rng, start, phase.seconds, rate, end_rate):
                    found.append(
                        SimRequest(t, model, phase.priority, profile.service_s, profile.cost_tokens)
                    )
            start += phase.seconds
        for burst in self.bursts:
            found += _burst_requests(burst, self.profiles[burst.model], self.seconds)
        found.sort(key=lambda r: r.t)
        return found


def _poisson(
    rng: random.Random, start: float, seconds: float, rate: float, end_rate: float
) -> list[float]:
    """Arrival times of a Poisson process over [start, start + seconds), its rate going
    from `rate` to `end_rate` in a straight line (thinning, for a ramp)."""
    times = []
    peak = max(rate, end_rate)
    t = start
    while peak > 0:
        t += rng.expovariate(peak)
        if t >= start + seconds:
            break
        if rate != end_rate:
            now = rate + (end_rate - rate) * (t - start) / seconds
            if rng.random() * peak > now:
                continue
        times.append(t)
    return times


def _burst_requests(burst: Burst, profile: ModelProfile, end: float) -> list[SimRequest]:
    service = profile.service_s if burst.service_s is None else burst.service_s
    cost = profile.cost_tokens if burst.cost_tokens is None else burst.cost_tokens
    found = []
    at = burst.start_s
    while at < end:
        for i in range(burst.requests):
            t = at + burst.spread_s * i / burst.requests
            if t < end:
                found += [SimRequest(t, burst.model, burst.priority, service, cost)] * burst.n
        at += burst.every_s
    return found


# Two models of two tenants on a fleet of four 1-GPU nodes: demand moves from one model
# to the other, a spike on the lower priority, then quiet (loadtest/autoscale-config/cluster.yaml).
SHIFTING = Workload(
    phases=(
        Phase("even", 60, {"llm-small": 3.0, "llm-large": 3.0}),
        Phase("large rises", 90, {"llm-small": 1.0, "llm-large": 9.0}),
        Phase("small spikes", 90, {"llm-small": 8.0, "llm-large": 1.0}),
        Phase("quiet", 60, {"llm-small": 0.3, "llm-large": 0.3}),
    ),
    profiles={
        "llm-large": ModelProfile(service_s=1.0, prefill_s=0.1, ttft_target_s=1.0),
        "llm-small": ModelProfile(service_s=1.0, prefill_s=0.1, ttft_target_s=1.0),
    },
)


@dataclass(frozen=True, slots=True)
class Sample:
    """The fleet at the end of one interval."""

    t: float
    demand: dict[str, float]  # arrivals a second over the interval, per model
    replicas: dict[str, int]  # ready, per model
    gpus: float  # held (ready, loading or draining)


@dataclass(slots=True)
class PolicyResult:
    """One policy's figures on the trace."""

    policy: str
    requests: int = 0
    within_slo: int = 0
    refused: int = 0
    gpu_seconds: float = 0.0
    replica_changes: int = 0
    lost: int = 0  # requests on a replica when it was unloaded (the drain makes it 0)
    seconds: float = 0.0
    timeline: list[Sample] = field(default_factory=list)  # one per interval
    # Each load (+1) and unload (-1) of a replica: (seconds from the start, model, +-1).
    changes: list[tuple[float, str, int]] = field(default_factory=list)

    def changes_within(self, seconds: float) -> int:
        """Loads and unloads in the trace's first `seconds`."""
        return sum(1 for t, _, _ in self.changes if t <= seconds)

    @property
    def slo_attainment(self) -> float:
        """The share of requests whose first token came within the model's target."""
        return self.within_slo / self.requests if self.requests else 1.0

    @property
    def goodput(self) -> float:
        """Requests within their SLO a second."""
        return self.within_slo / self.seconds if self.seconds else 0.0

    def row(self) -> dict[str, object]:
        """The figures, for a table or JSON."""
        return {
            "policy": self.policy,
            "requests": self.requests,
            "slo_attainment": round(self.slo_attainment, 4),
            "goodput_rps": round(self.goodput, 2),
            "refused": self.refused,
            "fallbacks": 0,
            "gpu_seconds": round(self.gpu_seconds, 1),
            "replica_changes": self.replica_changes,
            "lost": self.lost,
        }


@dataclass(slots=True)
class _Model:
    profile: ModelProfile
    slots: int
    # Per class, highest first: (arrival time, the request), oldest first.
    waiting: dict[str, deque[tuple[float, SimRequest]]] = field(
        default_factory=lambda: {name: deque() for name in CLASSES}
    )
    running: list[tuple[float, int, SimRequest]] = field(default_factory=list)  # heap: finish
    arrived: int = 0  # this interval
    ttfts: list[float] = field(default_factory=list)  # this interval
    started: int = 0  # a tie-breaker for the heap
    # Since the start, as the admission counts them: arrivals and the tokens they
    # reserved per class; completions, the seconds their slots were held, their tokens.
    arrivals: dict[str, list[int]] = field(default_factory=lambda: {c: [0, 0] for c in CLASSES})
    completions: int = 0
    busy_s: float = 0.0
    completed_tokens: int = 0

    @property
    def queued(self) -> int:
        return sum(len(queue) for queue in self.waiting.values())

    def arrive(self, request: SimRequest, now: float, result: PolicyResult) -> None:
        """Queue `request`, or refuse it (a full queue), as admission does; counted
        either way."""
        self.arrived += 1
        counted = self.arrivals[request.priority]
        counted[0] += 1
        counted[1] += request.cost_tokens
        bound = self.profile.max_queued
        if bound is not None and self.queued >= bound:
            lower = [q for name, q in self.waiting.items() if _below(name, request.priority) and q]
            if not lower:
                result.refused += 1
                return
            lower[-1].pop()  # the newest of the lowest class that waits is shed
            result.refused += 1
        self.waiting[request.priority].append((now, request))


class _Fleet:
    """Replicas placed, ready, or draining, and the GPU they hold."""

    def __init__(self, cluster: ClusterConfig, load_s: float) -> None:
        self._gpus = {
            d.model: replica_pod(d, 0).requested_milli / GPU_MILLI for d in cluster.deployments
        }
        self._load_s = load_s
        self.ready_at: dict[tuple[str, int, str], float] = {}
        self.draining: dict[tuple[str, int, str], float] = {}  # holds its GPU until then
        self.changes = 0

    def start(self, plan: DeploymentPlan) -> None:
        """The first placement: ready from the start, not counted as a change."""
        self.ready_at = {(p.model, p.index, p.node): 0.0 for p in plan.placements}

    def move_to(
        self,
        plan: DeploymentPlan,
        now: float,
        service_s: Mapping[str, float],
        changes: list[tuple[float, str, int]],
    ) -> None:
        placed = {(p.model, p.index, p.node) for p in plan.placements}
        for replica in sorted(placed - set(self.ready_at)):
            self.ready_at[replica] = now + self._load_s
            self.changes += 1
            changes.append((now, replica[0], 1))
        for replica in sorted(set(self.ready_at) - placed):
            del self.ready_at[replica]
            self.draining[replica] = now + service_s.get(replica[0], 0.0)
            self.changes += 1
            changes.append((now, replica[0], -1))

    def ready_nodes(self, model: str, now: float) -> int:
        return len({n for (m, _, n), at in self.ready_at.items() if m == model and at <= now})

    def gpus_held(self, now: float) -> float:
        for replica in [r for r, until in self.draining.items() if until <= now]:
            del self.draining[replica]
        held = list(self.ready_at) + list(self.draining)
        return sum(self._gpus.get(model, 1) for model, _, _ in held)


def run_policy(
    cluster: ClusterConfig,
    workload: Workload,
    loop: bool,
    load_s: float = 2.0,
    max_wait_s: float = 10.0,
) -> PolicyResult:
    """Replay `workload` on `cluster`: with the closed loop (`loop`), or with each
    deployment's replicas fixed at its `replicas` (static)."""
    result = PolicyResult("closed loop" if loop else "static")
    slots = {
        d.model: (d.autoscale.slots_per_replica if d.autoscale else None) or 1
        for d in cluster.deployments
    }
    if not loop:
        cluster = cluster.model_copy(
            update={
                "deployments": [
                    d.model_copy(update={"autoscale": None}) for d in cluster.deployments
                ]
            }
        )
    models = {
        name: _Model(profile, slots.get(name, 1)) for name, profile in workload.profiles.items()
    }
    service = {name: p.service_s for name, p in workload.profiles.items()}
    autoscaler = Autoscaler(cluster, None, slots) if loop else None
    plan = plan_deployments(cluster)
    fleet = _Fleet(cluster, load_s)
    fleet.start(plan)
    interval = cluster.autoscaling.interval_s
    arrivals = deque(workload.requests())
    end = workload.seconds
    steps = math.ceil(end / STEP_S)
    ticks = 0
    next_tick = interval
    if autoscaler is not None:  # the gateway's first report: rates count from the next
        autoscaler.demand([_report(models, 0.0)])
    for step in range(1, steps + 1):
        now = step * STEP_S
        while arrivals and arrivals[0].t <= now:
            request = arrivals.popleft()
            models[request.model].arrive(request, now, result)
            result.requests += 1
        for name, model in models.items():
            _serve(model, now, fleet.ready_nodes(name, now), max_wait_s, result)
        result.gpu_seconds += fleet.gpus_held(now) * STEP_S
        if now + 1e-9 >= next_tick:
            next_tick += interval
            ticks += 1
            result.timeline.append(_snapshot(now, models, fleet, interval))
            if autoscaler is not None:
                demand = autoscaler.demand([_report(models, ticks * interval)])
                autoscaler.observe(plan, now)
                # A change, or a replica still waiting for room: place again.
                if autoscaler.decide(plan, now, demand) or plan.unplaced:
                    plan = plan_deployments(
                        autoscaler.cluster_for(cluster),
                        keep=plan,
                        protected=autoscaler.protected(now),
                    )
                    fleet.move_to(plan, now, service, result.changes)
                    autoscaler.observe(plan, now)
            for model in models.values():
                model.arrived = 0
                model.ttfts.clear()
    result.seconds = end
    result.replica_changes = fleet.changes
    return result


def _serve(model: _Model, now: float, nodes: int, max_wait_s: float, result: PolicyResult) -> None:
    """Finish what is done, refuse what waited too long, start what fits (online first)."""
    while model.running and model.running[0][0] <= now:
        _, _, request = heapq.heappop(model.running)
        model.completions += 1
        model.busy_s += request.service_s
        model.completed_tokens += request.cost_tokens
    for queue in model.waiting.values():
        while queue and now - queue[0][0] > max_wait_s:
            queue.popleft()
            result.refused += 1
    for queue in model.waiting.values():
        while queue and len(model.running) < nodes * model.slots:
            arrived, request = queue.popleft()
            model.started += 1
            heapq.heappush(model.running, (now + request.service_s, model.started, request))
            ttft = now - arrived + model.profile.prefill_s
            model.ttfts.append(ttft)
            if ttft <= model.profile.ttft_target_s:
                result.within_slo += 1


def _below(priority: str, than: str) -> bool:
    """Whether class `priority` is below class `than`."""
    return CLASSES.index(priority) > CLASSES.index(than)


def _report(models: Mapping[str, _Model], at: float) -> GatewayReport:
    """What the one gateway would report now (`at`: its clock)."""
    return GatewayReport("sim", at, {name: _model_report(m) for name, m in models.items()})


def _model_report(model: _Model) -> ModelReport:
    ttfts = sorted(model.ttfts)
    p95 = ttfts[min(len(ttfts) - 1, int(0.95 * len(ttfts)))] if ttfts else None
    classes = {}
    for name in CLASSES:
        queue = model.waiting[name]
        arrivals, tokens = model.arrivals[name]
        classes[name] = ClassReport(
            arrivals,
            tokens,
            len(queue),
            sum(request.cost_tokens for _, request in queue),
            sum(1 for _, _, request in model.running if request.priority == name),
        )
    return ModelReport(
        sum(arrivals for arrivals, _ in model.arrivals.values()),
        model.completions,
        model.busy_s,
        model.queued,
        len(model.running),
        p95,
        model.completed_tokens,
        classes,
    )


def _snapshot(now: float, models: Mapping[str, _Model], fleet: _Fleet, interval: float) -> Sample:
    return Sample(
        round(now, 2),
        {name: model.arrived / interval for name, model in models.items()},
        {name: fleet.ready_nodes(name, now) for name in models},
        fleet.gpus_held(now),
    )
