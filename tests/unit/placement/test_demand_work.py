"""Demand as work (issue 40): the admission counts each class's requests with the tokens
they reserved (a request's `n` choices are `n` requests), a gateway reports them, and
the leader weighs each request by its cost against the mean of those that finished; the
batch classes' part is told apart. A report of an earlier version counts requests."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from gateway.admission import AdmissionController
from gateway_control.placement.demand_board import (
    ClassReport,
    DemandBoard,
    DemandTracker,
    GatewayReport,
    ModelReport,
)
from gateway_control.placement.demand_reporter import DemandReporter, TtftWindow
from tests.fake_clock import FakeClock


def report(at: float, **models: ModelReport) -> GatewayReport:
    return GatewayReport("gw", at, models)


async def test_the_admission_counts_each_class_with_the_tokens_it_reserved() -> None:
    clock = FakeClock()
    admission = AdmissionController(("online", "batch"), clock=clock)
    admission.configure_model("llm", 10, lambda: 17)
    online = await admission.acquire("llm", "acme", priority="online", cost_tokens=300)
    # A batch request with n: 16 is 16 requests to admission, each with its own tokens.
    choices = [
        await admission.acquire("llm", "globex", priority="batch", cost_tokens=20)
        for _ in range(16)
    ]
    waiting = asyncio.create_task(
        admission.acquire("llm", "globex", priority="batch", cost_tokens=20)
    )
    await asyncio.sleep(0)
    clock.advance(2.0)
    for slot in choices[:4]:
        admission.release(slot, 5)
    await asyncio.sleep(0)  # a slot went to the waiter
    board = DemandBoard(cast(Any, None), "test", 30.0)  # not published to here
    reporter = DemandReporter(board, admission, ["llm"], 5.0, ttft=TtftWindow(dict))
    seen = reporter.report().models["llm"]
    assert (seen.arrivals, seen.completions, seen.completed_tokens) == (18, 4, 80)
    assert seen.classes["online"] == ClassReport(1, 300, 0, 0, 1)
    assert seen.classes["batch"] == ClassReport(17, 340, 0, 0, 13)
    admission.release(online, 300)
    waiting.cancel()


def test_demand_is_work_weighed_by_tokens_not_a_count_of_requests() -> None:
    tracker = DemandTracker(batch_classes=("batch",))
    zero = ClassReport(0, 0, 0, 0, 0)
    tracker.update([report(0.0, llm=ModelReport(0, 0, 0.0, 0, 0, None, 0, {"online": zero}))])
    # In 10 s: 10 online requests of 100 tokens and 160 batch choices of 10 tokens; the
    # 50 that finished had reserved 5,000 tokens (100 a request on average) and held
    # their slots 50 s; 4 batch choices of 10 tokens wait.
    classes = {
        "online": ClassReport(10, 1_000, 0, 0, 2),
        "batch": ClassReport(160, 1_600, 4, 40, 6),
    }
    now = ModelReport(170, 50, 50.0, 4, 8, None, 5_000, classes)
    demand = tracker.update([report(10.0, llm=now)])["llm"]
    # 2,600 tokens in 10 s, at 100 a request: 2.6 requests of the mean a second.
    assert demand.arrival_rate == pytest.approx(2.6)
    assert demand.service_s == pytest.approx(1.0)
    assert demand.queued == pytest.approx(0.4) and demand.in_flight == 8
    assert demand.online is not None
    assert demand.online.arrival_rate == pytest.approx(1.0)
    assert (demand.online.queued, demand.online.in_flight) == (0, 2)


def test_an_earlier_versions_report_counts_requests_all_online() -> None:
    tracker = DemandTracker(batch_classes=("batch",))
    tracker.update([report(0.0, llm=ModelReport(0, 0, 0.0, 0, 0))])
    demand = tracker.update([report(10.0, llm=ModelReport(170, 50, 50.0, 4, 8))])["llm"]
    assert (demand.arrival_rate, demand.queued, demand.in_flight) == (17.0, 4, 8)
    assert demand.online is None  # all of it may add replicas, as before


def test_before_anything_finished_requests_count_by_the_mean_of_what_arrived() -> None:
    tracker = DemandTracker(batch_classes=("batch",))
    zero = {"online": ClassReport(0, 0, 0, 0, 0), "batch": ClassReport(0, 0, 0, 0, 0)}
    tracker.update([report(0.0, llm=ModelReport(0, 0, 0.0, 0, 0, None, 0, zero))])
    classes = {"online": ClassReport(4, 400, 0, 0, 4), "batch": ClassReport(4, 0, 0, 0, 0)}
    demand = tracker.update([report(2.0, llm=ModelReport(8, 0, 0.0, 0, 4, None, 0, classes))])
    # 400 tokens for 8 requests: 50 each; the online 400 are 8 of those, 4 a second.
    assert demand["llm"].arrival_rate == pytest.approx(4.0)
    assert demand["llm"].online is not None
    assert demand["llm"].online.arrival_rate == pytest.approx(4.0)


def test_the_batch_apis_lines_keep_replicas_and_add_none_whatever_the_config() -> None:
    tracker = DemandTracker(batch_classes=())  # a cluster file that names no batch class
    zero = {"online": ClassReport(0, 0, 0, 0, 0), "batch-api": ClassReport(0, 0, 0, 0, 0)}
    tracker.update([report(0.0, llm=ModelReport(0, 0, 0.0, 0, 0, None, 0, zero))])
    classes = {
        "online": ClassReport(10, 1_000, 0, 0, 1),
        "batch-api": ClassReport(90, 9_000, 0, 0, 7),
    }
    now = ModelReport(100, 100, 100.0, 0, 8, None, 10_000, classes)
    demand = tracker.update([report(10.0, llm=now)])["llm"]
    assert demand.arrival_rate == pytest.approx(10.0)  # all of it keeps replicas
    assert demand.online is not None
    assert demand.online.arrival_rate == pytest.approx(1.0)  # only online adds them
    assert demand.online.in_flight == 1
