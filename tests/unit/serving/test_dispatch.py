"""The dispatcher and failover against a scripted backend: slots, deadlines, replica health.

Real asyncio time, kept to tens of milliseconds; a replica that "hangs" sleeps an hour,
so a test that waits on one fails on its own timeout instead of passing by luck.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import AsyncGenerator, Sequence
from typing import Any
from unittest import mock

import pytest

from gateway.admission import AdmissionController
from gateway.backends.base import ReplicaUnavailable, UpstreamTimeout
from gateway.config import FallbackReason, ModelConfig
from gateway.inference.types import (
    Completion,
    Delta,
    InferenceRequest,
    RequestKind,
    SamplingParams,
    UpstreamCall,
    Usage,
)
from gateway.observability import metrics
from gateway.serving.dispatch import DeadlineMissed, Dispatcher, Work
from gateway.serving.runtime import _capacity, _follow_ejections, _route
from gateway.upstream import failover
from gateway.upstream.backoff import Backoff
from gateway.upstream.failover import NoReplicaLeft
from gateway.upstream.outlier import OutlierDetector, ReplicaState
from gateway.upstream.pool import Replica
from gateway.upstream.route import ModelRoute
from tests.fake_clock import FakeClock

HANG = 3600.0  # seconds: a replica that never answers
# What a scripted replica does, step by step: send a piece, wait, or fail.
Step = str | float | type[Exception]


class ScriptedBackend:
    """Each replica (by host) runs its script for every request."""

    renders_prompt = True

    def __init__(self, **scripts: Sequence[Step]) -> None:
        self.scripts = {f"http://{host}": list(steps) for host, steps in scripts.items()}
        self.calls: list[str] = []
        self.open_streams = 0

    async def _run(self, url: str) -> AsyncGenerator[str, None]:
        self.calls.append(url)
        for step in self.scripts[url]:
            if isinstance(step, type):
                raise step(f"{url} failed")
            if isinstance(step, float):
                await asyncio.sleep(step)
            else:
                yield step

    async def complete(self, url: str, call: UpstreamCall) -> Completion:
        pieces = [piece async for piece in self._run(url)]
        return Completion(" ".join(pieces), Usage(1, len(pieces)))

    async def stream(self, url: str, call: UpstreamCall) -> AsyncGenerator[Delta, None]:
        self.open_streams += 1
        try:
            async for piece in self._run(url):
                yield Delta(piece)
        finally:
            self.open_streams -= 1

    async def ready(self, url: str, upstream_model: str, timeout_s: float) -> bool:
        return True

    async def close(self) -> None:
        pass


_names = iter(range(1_000_000))


def make_route(
    backend: ScriptedBackend, clock: FakeClock | None = None, **config: Any
) -> ModelRoute:
    """A model (with a name of its own, for metrics) on the backend's replicas."""
    model = ModelConfig.model_validate(
        {
            "backend": "triton_http",
            "replicas": [{"url": url} for url in backend.scripts],
            **config,
        }
    )
    route = dataclasses.replace(_route(f"m{next(_names)}", model), backend=backend)
    if clock is not None:
        outlier = model.outlier
        detector = OutlierDetector(
            outlier.consecutive_failures,
            outlier.base_ejection_s,
            outlier.max_ejection_s,
            clock,
            replicas=route.pool.replicas,
        )
        resilience = dataclasses.replace(route.resilience, outlier=detector)
        route = dataclasses.replace(route, resilience=resilience)
    return route


def make_work(
    *chain: ModelRoute, stream: bool = True, deadline_s: float = 5.0, max_tokens: int = 5
) -> Work:
    request = InferenceRequest(
        RequestKind.COMPLETION, chain[0].name, SamplingParams(max_tokens), stream, prompt="hi"
    )
    call = chain[0].upstream_call(request)
    return Work(request, chain, "t", 1.0, "online", 10, time.monotonic() + deadline_s, call)


def admission_for(*routes: ModelRoute, max_queued: int = 8) -> AdmissionController:
    admission = AdmissionController()
    for route in routes:
        admission.configure_model(route.name, max_queued, _capacity(route))
    return admission


def in_flight(admission: AdmissionController, route: ModelRoute) -> int:
    return admission.snapshot(route.name).in_flight


def counter(metric: Any, *labels: str) -> float:
    return float(metric.labels(*labels)._value.get())


def replica(route: ModelRoute, host: str) -> Replica:
    return next(r for r in route.pool.replicas if r.url == f"http://{host}")


# -- 1. a stream gives its slot back however it is closed --------------------------------


async def test_an_empty_stream_gives_its_slot_back_at_once() -> None:
    route = make_route(ScriptedBackend(a=[]))
    admission = admission_for(route)
    first, rest, _ = await Dispatcher(admission).stream(make_work(route))
    assert first is None
    assert in_flight(admission, route) == 0
    await rest.aclose()  # what the API does with an empty stream: close it unread
    await rest.aclose()
    assert in_flight(admission, route) == 0


async def test_a_stream_closed_unread_gives_its_slot_back_and_cancels_upstream() -> None:
    backend = ScriptedBackend(a=["one", "two", HANG])
    route = make_route(backend)
    admission = admission_for(route)
    first, rest, _ = await Dispatcher(admission).stream(make_work(route))
    assert first == Delta("one")
    assert in_flight(admission, route) == 1
    # The client left at the first event: the API closes the rest without reading it.
    await rest.aclose()
    assert in_flight(admission, route) == 0
    assert backend.open_streams == 0
    assert replica(route, "a").outstanding == 0
    await rest.aclose()  # closing again gives back nothing more
    assert in_flight(admission, route) == 0
    with pytest.raises(StopAsyncIteration):
        await anext(rest)


async def test_a_stream_read_to_the_end_charges_its_tokens() -> None:
    route = make_route(ScriptedBackend(a=["one", "two", "three"]))
    admission = admission_for(route)
    first, rest, _ = await Dispatcher(admission).stream(make_work(route))
    assert first is not None
    assert [delta.text async for delta in rest] == ["two", "three"]
    assert in_flight(admission, route) == 0
    assert admission.snapshot(route.name).served_tokens == {"t": 3}
    await rest.aclose()
    assert in_flight(admission, route) == 0


# -- 2. ejected replicas are not capacity; each replica keeps its cap ----------------------


def test_capacity_counts_only_replicas_in_use() -> None:
    clock = FakeClock()
    route = make_route(
        ScriptedBackend(a=[], b=[]),
        clock,
        queue={"max_in_flight_per_replica": 4},
        outlier={"consecutive_failures": 1, "base_ejection_s": 5.0},
    )
    capacity = _capacity(route)
    outlier = route.resilience.outlier
    a, b = route.pool.replicas
    assert capacity() == 8
    outlier.record_failure(b)
    assert capacity() == 4  # ejected: none of b's share
    clock.advance(5.0)
    assert outlier.state(b) is ReplicaState.HALF_OPEN
    assert capacity() == 5  # half-open: its one probe
    outlier.record_success(b)
    assert capacity() == 8
    outlier.record_failure(a)
    outlier.record_failure(b)
    assert capacity() == 4  # every replica ejected: the panic replica's share
    a.healthy = b.healthy = False
    assert capacity() == 4


async def test_survivors_of_an_ejection_keep_their_cap() -> None:
    backend = ScriptedBackend(a=["ok"], b=["ok"])
    route = make_route(
        backend, queue={"max_in_flight_per_replica": 1}, outlier={"consecutive_failures": 1}
    )
    a, b = route.pool.replicas
    route.resilience.outlier.record_failure(b)
    a.outstanding = 1  # a has its one request already
    with pytest.raises(NoReplicaLeft):
        await failover.complete(route, make_work(route).first_call, time.monotonic() + 5)
    assert backend.calls == []


async def test_ejection_and_return_recount_the_slots_for_waiters() -> None:
    clock = FakeClock()
    route = make_route(
        ScriptedBackend(a=[], b=[]),
        clock,
        queue={"max_in_flight_per_replica": 1},
        outlier={"consecutive_failures": 1},
    )
    admission = admission_for(route)
    _follow_ejections(route, admission)
    _, b = route.pool.replicas
    outlier = route.resilience.outlier
    outlier.record_failure(b)
    await admission.acquire(route.name, "t", priority="online", cost_tokens=1)
    waiter = asyncio.ensure_future(
        admission.acquire(route.name, "t", priority="online", cost_tokens=1)
    )
    await asyncio.sleep(0)
    assert not waiter.done()  # one slot: a's
    clock.advance(5.0)
    outlier.record_success(b)  # b back in service: its slot goes to the waiter at once
    await asyncio.sleep(0)
    assert waiter.done()
    assert in_flight(admission, route) == 2


async def test_a_cool_down_ending_admits_a_waiter() -> None:
    route = make_route(
        ScriptedBackend(a=[], b=[]),
        queue={"max_in_flight_per_replica": 1},
        outlier={"consecutive_failures": 1, "base_ejection_s": 0.05},
    )
    admission = admission_for(route)
    _follow_ejections(route, admission)
    route.resilience.outlier.record_failure(route.pool.replicas[1])
    await admission.acquire(route.name, "t", priority="online", cost_tokens=1)
    waiter = asyncio.ensure_future(
        admission.acquire(route.name, "t", priority="online", cost_tokens=1)
    )
    await asyncio.sleep(0.01)
    assert not waiter.done()
    # Nothing is released: only the end of b's cool-down (a probe slot) lets it in.
    await asyncio.wait_for(waiter, 1.0)


# -- 3. hung replicas count as failing; cancellations do not ----------------------------


async def test_a_replica_silent_past_the_first_token_budget_is_ejected() -> None:
    backend = ScriptedBackend(a=[HANG], b=["ok"])
    route = make_route(
        backend,
        timeouts={"first_token_s": 0.03},
        outlier={"consecutive_failures": 1},
    )
    admission = admission_for(route)
    route.pool.replicas[1].outstanding = 1  # a is picked first
    with pytest.raises(DeadlineMissed):
        await Dispatcher(admission).stream(make_work(route))
    assert route.resilience.outlier.state(replica(route, "a")) is ReplicaState.EJECTED
    assert backend.open_streams == 0 and in_flight(admission, route) == 0


@pytest.mark.parametrize(("per_prompt_token_s", "served"), [(0.0, False), (0.0002, True)])
async def test_the_first_token_budget_grows_with_the_prompt(
    per_prompt_token_s: float, served: bool
) -> None:
    # A coding agent's first request: about 1,000 tokens of instructions here, whose
    # prefill takes longer than the model's base budget (0.03 s) allows on its own.
    route = make_route(
        ScriptedBackend(a=[0.12, "ok"]),
        timeouts={"first_token_s": 0.03, "first_token_per_prompt_token_s": per_prompt_token_s},
    )
    request = InferenceRequest(
        RequestKind.COMPLETION, route.name, SamplingParams(5), True, prompt="word " * 800
    )
    call = route.upstream_call(request)
    assert call.prompt_estimate >= 900  # the budget: 0.03 + 0.0002 x 1,000 = 0.23 s
    work = Work(request, [route], "t", 1.0, "online", 10, time.monotonic() + 5.0, call)
    if not served:
        with pytest.raises(DeadlineMissed, match="no first token"):
            await Dispatcher(admission_for(route)).stream(work)
        return
    first, rest, _ = await Dispatcher(admission_for(route)).stream(work)
    await rest.aclose()
    assert first is not None and first.text == "ok"


async def test_a_deadline_shorter_than_the_budget_blames_no_replica() -> None:
    route = make_route(
        ScriptedBackend(a=[HANG]),
        timeouts={"first_token_s": 5.0},
        outlier={"consecutive_failures": 1},
    )
    with pytest.raises(DeadlineMissed):
        await Dispatcher(admission_for(route)).stream(make_work(route, deadline_s=0.03))
    assert route.resilience.outlier.state(route.pool.replicas[0]) is ReplicaState.IN_SERVICE


@pytest.mark.parametrize("stream", [False, True])
async def test_backend_timeouts_count_as_failures(stream: bool) -> None:
    route = make_route(ScriptedBackend(a=[UpstreamTimeout]), outlier={"consecutive_failures": 1})
    with pytest.raises(UpstreamTimeout):
        await getattr(Dispatcher(admission_for(route)), "stream" if stream else "complete")(
            make_work(route, stream=stream)
        )
    assert route.resilience.outlier.state(route.pool.replicas[0]) is ReplicaState.EJECTED


async def test_a_backend_timeout_mid_stream_counts_as_a_failure() -> None:
    route = make_route(
        ScriptedBackend(a=["one", UpstreamTimeout]), outlier={"consecutive_failures": 1}
    )
    admission = admission_for(route)
    _, rest, _ = await Dispatcher(admission).stream(make_work(route))
    with pytest.raises(UpstreamTimeout):
        await anext(rest)
    assert route.resilience.outlier.state(route.pool.replicas[0]) is ReplicaState.EJECTED
    assert in_flight(admission, route) == 0


async def test_a_cancelled_request_blames_no_replica() -> None:
    route = make_route(ScriptedBackend(a=[HANG]), outlier={"consecutive_failures": 1})
    admission = admission_for(route)
    task = asyncio.ensure_future(Dispatcher(admission).stream(make_work(route)))
    await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert route.resilience.outlier.state(route.pool.replicas[0]) is ReplicaState.IN_SERVICE


# -- 4. a retry spends budget only when there is a replica to retry on ------------------


async def test_a_single_replica_spends_no_retry_budget() -> None:
    route = make_route(
        ScriptedBackend(a=[ReplicaUnavailable]),
        max_attempts=3,
        retry={"budget_ratio": 0.0, "budget_min_per_s": 0.1, "budget_window_s": 10,
               "backoff_base_s": 0.5, "backoff_cap_s": 0.5},
    )  # fmt: skip
    # Backoffs drawn from a generator the test sees: none drawn is none waited.
    draws = mock.Mock(spec=random.Random, uniform=mock.Mock(return_value=0.5))
    backoff = Backoff(0.5, 0.5, rng=draws)
    route = dataclasses.replace(
        route, resilience=dataclasses.replace(route.resilience, backoff=backoff)
    )
    budget = route.resilience.budget
    assert budget.remaining() == 1
    with pytest.raises(NoReplicaLeft):
        await failover.complete(route, make_work(route).first_call, time.monotonic() + 5)
    draws.uniform.assert_not_called()  # no backoff waited for nothing
    assert budget.remaining() == 1
    assert counter(metrics.RETRIES, route.name) == 0


async def test_a_retry_on_another_replica_spends_the_budget() -> None:
    backend = ScriptedBackend(a=[ReplicaUnavailable], b=["ok"])
    route = make_route(
        backend,
        retry={"budget_ratio": 0.0, "budget_min_per_s": 0.1, "budget_window_s": 10,
               "backoff_base_s": 0.001, "backoff_cap_s": 0.001},
    )  # fmt: skip
    route.pool.replicas[1].outstanding = 1  # a is picked first
    first, rest, _ = await Dispatcher(admission_for(route)).stream(make_work(route))
    await rest.aclose()
    assert first == Delta("ok") and backend.calls == ["http://a", "http://b"]
    assert route.resilience.budget.remaining() == 0
    assert counter(metrics.RETRIES, route.name) == 1


# -- 5. a started stream ends at the request's deadline ---------------------------------


async def test_a_started_stream_ends_with_a_timeout_at_the_deadline() -> None:
    backend = ScriptedBackend(a=["one", "two", HANG])
    route = make_route(backend, outlier={"consecutive_failures": 1})
    admission = admission_for(route)
    work = make_work(route, deadline_s=0.1)
    _, rest, _ = await Dispatcher(admission).stream(work)
    assert await anext(rest) == Delta("two")
    # A hang guard only: the stream hangs for good, so only the deadline can end it.
    with pytest.raises(UpstreamTimeout, match="before the request deadline"):
        await asyncio.wait_for(anext(rest), 30.0)
    assert time.monotonic() >= work.deadline - 0.01  # the deadline had passed
    assert in_flight(admission, route) == 0
    assert backend.open_streams == 0 and route.pool.replicas[0].outstanding == 0
    # The gateway's deadline, not the replica's fault.
    assert route.resilience.outlier.state(route.pool.replicas[0]) is ReplicaState.IN_SERVICE
    await rest.aclose()
    assert in_flight(admission, route) == 0


async def test_a_deadline_between_reads_gives_the_slot_back_at_once() -> None:
    backend = ScriptedBackend(a=["one", "two", "three"])
    route = make_route(backend)
    admission = admission_for(route)
    _, rest, _ = await Dispatcher(admission).stream(make_work(route, deadline_s=0.03))
    await asyncio.sleep(0.06)  # the reader is busy elsewhere
    assert in_flight(admission, route) == 0
    with pytest.raises(UpstreamTimeout):
        await anext(rest)
    assert backend.open_streams == 0


async def test_a_reader_cancelled_before_the_deadline_is_not_a_timeout() -> None:
    route = make_route(ScriptedBackend(a=["one", HANG]))
    admission = admission_for(route)
    _, rest, _ = await Dispatcher(admission).stream(make_work(route, deadline_s=5.0))
    reader = asyncio.ensure_future(anext(rest))
    await asyncio.sleep(0.02)
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert in_flight(admission, route) == 0


# -- 6. timed-out attempts teach the latency the predicted wait uses ---------------------


async def test_first_token_timeouts_teach_the_predicted_wait() -> None:
    big = make_route(
        ScriptedBackend(a=[HANG]),
        timeouts={"first_token_s": 0.05},
        fallback_on=["ttft_timeout", "predicted_wait"],
        outlier={"consecutive_failures": 100},
    )
    small = make_route(ScriptedBackend(a=["small"]))
    dispatcher = Dispatcher(admission_for(big, small))
    _, rest, served = await dispatcher.stream(make_work(big, small))
    await rest.aclose()
    assert served.fallbacks[-1].reason is FallbackReason.TTFT_TIMEOUT
    ttft = big.resilience.latency.ttft_s
    assert ttft is not None and ttft >= 0.045
    # Known slow now: a deadline shorter than its usual TTFT goes to `small` up front.
    _, rest, served = await dispatcher.stream(make_work(big, small, deadline_s=0.04))
    await rest.aclose()
    assert served.route is small
    assert served.fallbacks[-1].reason is FallbackReason.PREDICTED_WAIT


async def test_a_short_timeout_does_not_lower_what_was_learned() -> None:
    route = make_route(ScriptedBackend(a=[HANG]), timeouts={"first_token_s": 0.02})
    route.resilience.latency.ttft_s = 10.0
    with pytest.raises(DeadlineMissed):
        await Dispatcher(admission_for(route)).stream(make_work(route, deadline_s=20))
    assert route.resilience.latency.ttft_s == 10.0


async def test_a_deadline_miss_teaches_the_whole_answer_time() -> None:
    route = make_route(ScriptedBackend(a=[HANG]))
    latency = route.resilience.latency
    with pytest.raises(DeadlineMissed):
        await Dispatcher(admission_for(route)).complete(
            make_work(route, stream=False, deadline_s=0.05, max_tokens=5)
        )
    assert latency.expected_s(False, 5, 1) >= 0.045


async def test_a_backoff_past_the_first_token_budget_is_a_first_token_timeout() -> None:
    backend = ScriptedBackend(a=[ReplicaUnavailable], b=["ok"])
    route = make_route(
        backend,
        timeouts={"first_token_s": 0.05},
        outlier={"consecutive_failures": 1},
    )
    # A backoff of 0.3 s, past the 0.05 s first-token budget.
    always = mock.Mock(spec=random.Random, uniform=lambda low, high: 0.3)
    backoff = Backoff(0.5, 0.5, rng=always)
    route = dataclasses.replace(
        route, resilience=dataclasses.replace(route.resilience, backoff=backoff)
    )
    route.pool.replicas[1].outstanding = 1  # a is picked first
    remaining = route.resilience.budget.remaining()
    retries = counter(metrics.RETRIES, route.name)
    with pytest.raises(DeadlineMissed, match="no first token"):
        await Dispatcher(admission_for(route)).stream(make_work(route))
    # The backoff was never waited: a retry is counted and paid for before its wait.
    assert counter(metrics.RETRIES, route.name) == retries
    assert backend.calls == ["http://a"]
    assert route.resilience.budget.remaining() == remaining
    assert route.resilience.outlier.state(replica(route, "b")) is ReplicaState.IN_SERVICE


# -- 7. one tenant's prompts cannot take replicas or the model away from the others -----


def cjk_work(route: ModelRoute, characters: int, deadline_s: float = 5.0) -> Work:
    """A streamed request whose prompt is `characters` CJK characters (3 bytes each)."""
    prompt = "".join(chr(0x4E00 + i % 20_000) for i in range(characters))
    request = InferenceRequest(
        RequestKind.COMPLETION, route.name, SamplingParams(5), True, prompt=prompt
    )
    call = route.upstream_call(request)
    return Work(request, [route], "t", 1.0, "online", 10, time.monotonic() + deadline_s, call)


async def test_a_cjk_prompts_first_token_budget_counts_its_characters() -> None:
    # 800 CJK characters, about 800 tokens, prefill 0.12 s; the budget is 0.03 s plus
    # 0.0002 s a token. Counted as characters/4 (200 tokens: 0.07 s) it timed out.
    route = make_route(
        ScriptedBackend(a=[0.12, "ok"]),
        timeouts={"first_token_s": 0.03, "first_token_per_prompt_token_s": 0.0002},
    )
    work = cjk_work(route, 800)
    assert work.first_call.prompt_estimate >= 800
    first, rest, _ = await Dispatcher(admission_for(route)).stream(work)
    await rest.aclose()
    assert first is not None and first.text == "ok"


@pytest.mark.parametrize(
    ("characters", "per_prompt_token_s"),
    [
        (2000, 0.0),  # a long prompt (2,500 tokens estimated), a fixed budget
        (400, 0.0002),  # a short prompt whose budget is mostly its own allowance
    ],
)
async def test_a_long_prompts_late_first_token_does_not_eject_a_healthy_replica(
    characters: int, per_prompt_token_s: float
) -> None:
    # Its prefill may take longer than any estimate says: the replica is not to blame.
    backend = ScriptedBackend(a=[HANG])
    route = make_route(
        backend,
        timeouts={"first_token_s": 0.03, "first_token_per_prompt_token_s": per_prompt_token_s},
        outlier={"consecutive_failures": 1},
    )
    admission = admission_for(route)
    with pytest.raises(DeadlineMissed, match="no first token"):
        await Dispatcher(admission).stream(cjk_work(route, characters))
    assert route.resilience.outlier.state(replica(route, "a")) is ReplicaState.IN_SERVICE
    assert backend.open_streams == 0 and in_flight(admission, route) == 0
    # A short request it fails in the same way ejects it: a hung replica is still found.
    with pytest.raises(DeadlineMissed):
        await Dispatcher(admission).stream(make_work(route))
    assert route.resilience.outlier.state(replica(route, "a")) is ReplicaState.EJECTED


async def test_a_long_prompts_late_first_token_counts_against_a_failing_replica() -> None:
    route = make_route(
        ScriptedBackend(a=[HANG]),
        timeouts={"first_token_s": 0.03},
        outlier={"consecutive_failures": 2},
    )
    route.resilience.outlier.record_failure(replica(route, "a"))  # failing already
    with pytest.raises(DeadlineMissed):
        await Dispatcher(admission_for(route)).stream(cjk_work(route, 2000))
    assert route.resilience.outlier.state(replica(route, "a")) is ReplicaState.EJECTED


async def test_a_prompt_heavy_tenant_does_not_send_others_to_the_fallback() -> None:
    big = make_route(ScriptedBackend(a=["big"]), fallback_on=["predicted_wait"])
    small = make_route(ScriptedBackend(a=["small"]))
    latency = big.resilience.latency
    for prompt in (100, 2000, 100, 6000):  # ordinary traffic, whole answers
        latency.observe(None, 0.05 + 0.0003 * prompt + 0.02 * 99, 100, prompt)
    # One tenant: 50 whole answers of a 100,000-token prompt and 2 output tokens, 30 s
    # each. Before, this made the time per token 30 s, and every request's predicted
    # wait past its deadline.
    for _ in range(50):
        latency.observe(None, 30.07, 2, 100_000)
    dispatcher = Dispatcher(admission_for(big, small))
    _, served = await dispatcher.complete(
        make_work(big, small, stream=False, deadline_s=5.0, max_tokens=100)
    )
    assert served.route is big and not served.fallbacks
    # The tenant's own next request of that shape is known to miss a 5 s deadline.
    request = InferenceRequest(
        RequestKind.COMPLETION, big.name, SamplingParams(2), False, prompt="word " * 100_000
    )
    work = Work(
        request, [big, small], "t", 1.0, "online", 10, time.monotonic() + 5.0,
        big.upstream_call(request),
    )  # fmt: skip
    _, served = await dispatcher.complete(work)
    assert served.route is small
    assert served.fallbacks[-1].reason is FallbackReason.PREDICTED_WAIT
