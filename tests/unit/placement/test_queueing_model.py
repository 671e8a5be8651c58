"""The queueing model the closed loop sizes replicas with, against known values of the
M/M/c queue and the behaviour the planner relies on."""

from __future__ import annotations

import math

import pytest

from gateway_control.placement.queueing_model import Demand, erlang_c, replicas_for, wait_quantile_s


@pytest.mark.parametrize(
    ("servers", "offered", "expected"),
    [
        (1, 0.5, 0.5),  # M/M/1: the chance to wait is the utilization
        (2, 1.0, 1 / 3),  # textbook value for c=2, a=1
        (10, 8.0, 0.409),  # tables: about 0.409
    ],
)
def test_erlang_c_matches_known_values(servers: int, offered: float, expected: float) -> None:
    assert erlang_c(servers, offered) == pytest.approx(expected, abs=1e-3)


def test_a_queue_that_cannot_keep_up_waits_forever() -> None:
    assert erlang_c(4, 4.0) == 1.0
    assert wait_quantile_s(4, Demand(arrival_rate=10, service_s=0.5)) == math.inf


def test_the_wait_tail_of_mm1_is_its_closed_form() -> None:
    # M/M/1 with rho 0.8, service 1 s: P(W > t) = 0.8 e^{-0.2 t}, so t95 = ln(16) / 0.2.
    assert wait_quantile_s(1, Demand(0.8, 1.0)) == pytest.approx(math.log(16) / 0.2)


def test_replicas_grow_with_demand_and_a_backlog_adds_to_it() -> None:
    def needed(rate: float, queued: int = 0) -> int:
        return replicas_for(Demand(rate, 2.0, queued), 4, 0.5, 0.75, backlog_horizon_s=10)

    counts = [needed(rate) for rate in (0.5, 2, 4, 8, 16)]
    assert counts == sorted(counts) and counts[0] == 1 and counts[-1] >= 11
    # 16 requests a second for 2 s each is 32 slots busy: at 75 % that is 43 slots.
    assert needed(16) * 4 >= 32 / 0.75
    assert needed(2, queued=100) > needed(2)


def test_no_demand_needs_no_replica_but_running_requests_keep_theirs() -> None:
    assert replicas_for(Demand(0.0, 1.0), 4, 0.5, 0.75, 10) == 0
    # A moving average that halves each interval after the last request: idle too.
    assert replicas_for(Demand(0.0004, 1.0), 4, 0.5, 0.75, 10) == 0
    assert replicas_for(Demand(0.0, 1.0, in_flight=9), 4, 0.5, 0.75, 10) == 3
    # Requests whose service time is not known yet still need a replica...
    assert replicas_for(Demand(1.0, 0.0), 4, 0.5, 0.75, 10) == 1
    # ...and when none finished yet (long streams), the slots of those running and
    # waiting: 9 running and 4 waiting fill four replicas of four.
    assert replicas_for(Demand(1.0, 0.0, queued=4, in_flight=9), 4, 0.5, 0.75, 10) == 4
