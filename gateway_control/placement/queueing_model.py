"""How many replicas a model needs for its demand: an M/M/c queue (Erlang C).

Pure: no I/O, no clock. A model's replicas are `c = replicas x slots` servers (the
gateway admits at most `slots` requests at once to each replica, and queues the rest:
`gateway.admission`), each serving one request in a mean `service_s` seconds, measured
by the gateways; requests arrive at `arrival_rate` a second. Erlang C gives the chance
that a request waits, and the waiting time's tail: P(wait > t) = C e^{-(c mu - lambda) t}.
The model is a guide, not the truth (service times are not exponential, arrivals come in
bursts), so the planner checks what the gateways measure as well (`replica_planner`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Never more servers than this in the sums below (a guard; real fleets are far smaller).
MAX_SERVERS = 100_000
# Below this many requests a second (one in about 17 minutes), with nothing waiting or
# running, a model is idle: a moving average that only halves each interval would
# otherwise never let it reach zero replicas.
IDLE_RATE = 0.001


@dataclass(frozen=True, slots=True)
class Demand:
    """One model's demand, summed over every gateway for the last interval. Requests
    count by their cost against the mean (`demand_board`): `arrival_rate x service_s` is
    the work that arrived, in slot-seconds a second."""

    arrival_rate: float  # requests a second
    service_s: float  # mean time a request holds its slot, seconds
    queued: float = 0  # requests waiting for a slot now
    in_flight: int = 0  # requests holding a slot now
    ttft_p95_s: float | None = None  # measured, the worst gateway's
    # The part of it that may add replicas to an online model: all but the batch
    # classes' (None: all of it).
    online: Demand | None = None


def erlang_c(servers: int, offered: float) -> float:
    """The chance an arrival waits, with `servers` servers and `offered` Erlangs of load
    (arrival rate x service time); 1.0 when the load is at or above the servers."""
    if offered <= 0:
        return 0.0
    if offered >= servers:
        return 1.0
    # Erlang B by its recurrence (stable for any size), then C from B.
    b = 1.0
    for k in range(1, servers + 1):
        b = offered * b / (k + offered * b)
    rho = offered / servers
    return b / (1 - rho + rho * b)


def wait_quantile_s(servers: int, demand: Demand, quantile: float = 0.95) -> float:
    """The `quantile` of the time a request waits for a slot (inf when the servers
    cannot keep up)."""
    if demand.arrival_rate <= 0 or demand.service_s <= 0:
        return 0.0
    offered = demand.arrival_rate * demand.service_s
    if offered >= servers:
        return math.inf
    waits = erlang_c(servers, offered)
    if waits <= 1 - quantile:
        return 0.0
    drain_rate = servers / demand.service_s - demand.arrival_rate
    return math.log(waits / (1 - quantile)) / drain_rate


def replicas_for(
    demand: Demand,
    slots: int,
    wait_p95_s: float,
    utilization: float,
    backlog_horizon_s: float,
) -> int:
    """The fewest replicas (of `slots` each) whose predicted p95 wait is within
    `wait_p95_s` and whose slots are at most `utilization` busy. Requests queued now
    count as extra arrivals spread over `backlog_horizon_s`, so a backlog is cleared
    within it. Never fewer than the requests running and waiting now fill, so that a
    busy model is not shrunk under them. 0 when the model is idle (`IDLE_RATE`)."""
    rate = demand.arrival_rate + demand.queued / backlog_horizon_s
    if rate < IDLE_RATE and demand.in_flight == 0:
        return 0
    holding = max(math.ceil((demand.in_flight + demand.queued) / slots), 1)
    if demand.service_s <= 0:
        # None finished yet (long streams): the service time is unknown, but the
        # requests there now need their slots.
        return holding
    offered = rate * demand.service_s
    # The slots that load needs at the target utilization; the requests running now
    # need theirs too.
    servers = max(math.ceil(offered / utilization), demand.in_flight, 1)
    replicas = math.ceil(servers / slots)
    busy = Demand(rate, demand.service_s)
    while replicas * slots < MAX_SERVERS and wait_quantile_s(replicas * slots, busy) > wait_p95_s:
        replicas += 1
    return replicas
