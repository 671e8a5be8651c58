"""Admission, fair share, priority, deadlines, fallback, retries: real Triton, real Redis.

Fair share and priority are checked on an upstream of the test's own that answers one
request each time the test says so: the test decides when the one slot frees, and reads
what the gateway charged each tenant after every request. What goes upstream next is
then the scheduler's choice alone, however loaded the machine is.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from gateway_tools.dev.processes import stop
from gateway_tools.dev.sim.server import TritonSim
from tests.e2e.stack import Gateway, model, start_gateway, tenant
from tests.e2e.test_rate_limits import key
from tests.e2e.upstreams import chat_upstream, serve_in_thread
from tests.polling import wait_until

SHORT = [{"role": "user", "content": "hi"}]
LONG = [{"role": "user", "content": "tell me about " + "the weather " * 30}]


async def post(
    session: aiohttp.ClientSession,
    gw: Gateway,
    who: str,
    model_name: str,
    messages: list[dict[str, str]] = SHORT,
    headers: dict[str, str] | None = None,
    **fields: Any,
) -> tuple[int, dict[str, str], dict[str, Any]]:
    body = {"model": model_name, "messages": messages, **fields}
    async with session.post(
        f"{gw.base_url}/chat/completions", json=body, headers={**key(who), **(headers or {})}
    ) as response:
        found = {name.lower(): value for name, value in response.headers.items()}
        if fields.get("stream"):
            text = await response.text()
            return response.status, found, {"sse": text}
        return response.status, found, await response.json()


@pytest.fixture(scope="module")
def failing_upstream() -> Iterator[tuple[list[str], Counter[str]]]:
    """Two OpenAI-style upstreams that pass health checks and fail every completion with
    503: the case a retry budget exists for. Counts the completion calls they get."""
    hits: Counter[str] = Counter()

    async def fail(request: web.Request) -> web.Response:
        hits[request.host] += 1
        return web.json_response({"error": {"message": "overloaded"}}, status=503)

    with serve_in_thread([chat_upstream(fail), chat_upstream(fail)]) as urls:
        yield urls, hits


class GatedUpstream:
    """An OpenAI-style upstream that answers one request per `let_one_through`.

    Each request's first word names its tenant; `arrived` lists them in the order they
    came (with one slot upstream, the order the gateway dispatched them). Its usage is
    exact: a token a word of the prompt, plus `max_tokens`.
    """

    def __init__(self) -> None:
        self.arrived: list[str] = []
        self._permits = asyncio.Semaphore(0)  # used on the upstream's loop only
        self._loop: asyncio.AbstractEventLoop | None = None

    async def answer(self, request: web.Request) -> web.Response:
        body = await request.json()
        words = body["messages"][-1]["content"].split()
        self._loop = asyncio.get_running_loop()
        self.arrived.append(words[0])
        await self._permits.acquire()
        usage = {"prompt_tokens": len(words), "completion_tokens": body["max_tokens"]}
        message = {"role": "assistant", "content": "ok"}
        return web.json_response({
            "id": "chatcmpl-gated", "object": "chat.completion", "created": 0,
            "model": body["model"], "usage": usage,
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        })  # fmt: skip

    def let_one_through(self, count: int = 1) -> None:
        """Answer the request held now (or, with none held, the next to arrive)."""
        assert self._loop is not None, "nothing has arrived yet"
        for _ in range(count):
            self._loop.call_soon_threadsafe(self._permits.release)


@pytest.fixture(scope="module")
def gated_upstream() -> Iterator[tuple[str, GatedUpstream]]:
    gate = GatedUpstream()
    with serve_in_thread([chat_upstream(gate.answer)]) as urls:
        try:
            yield urls[0], gate
        finally:
            if gate._loop is not None:  # a failed test may have left requests held
                gate.let_one_through(1000)


@pytest.fixture(scope="module")
def admission_gateway(
    sims: tuple[TritonSim, TritonSim],
    redis_url: str,
    failing_upstream: tuple[list[str], Counter[str]],
    gated_upstream: tuple[str, GatedUpstream],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Gateway]:
    grpc = [sims[0].grpc_target]
    models = {
        # llm-slow: 40 ms a token. Two in flight, six queued.
        "crowded": model(
            "triton_grpc", grpc, upstream_model="llm-slow",
            queue={"max_queued": 6, "max_in_flight_per_replica": 2},
        ),
        # One request at a time, on the gated upstream: the queue decides who goes next.
        "fair": model(
            "openai", [gated_upstream[0]],
            queue={"max_queued": 512, "max_in_flight_per_replica": 1},
        ),
        "solo": model(
            "triton_grpc", grpc, upstream_model="llm-slow",
            queue={"max_queued": 8, "max_in_flight_per_replica": 1},
        ),
        "big": model(
            "triton_grpc", grpc, upstream_model="llm-slow", fallback=["small"],
            timeouts={"first_token_s": 0.06},
        ),
        "small": model("triton_grpc", grpc, upstream_model="llm-small"),
        "strict": model("triton_grpc", grpc, upstream_model="llm-slow"),
        "failing": model(
            "openai", failing_upstream[0], max_attempts=3,
            retry={"budget_ratio": 0.2, "budget_min_per_s": 0.1, "budget_window_s": 10,
                   "backoff_base_s": 0.001, "backoff_cap_s": 0.002},
        ),
    }  # fmt: skip
    tenants = {
        "gold": tenant("gold", ["*"], share=3),
        "iron": tenant("iron", ["*"], share=1),
        "web": tenant("web", ["*"], priority="online"),
        "bulk": tenant("bulk", ["*"], priority="batch"),
    }
    gw = start_gateway(tmp_path_factory.mktemp("admission"), models, redis_url, tenants=tenants)
    try:
        yield gw
    finally:
        stop(gw.process)


async def test_overload_answers_every_request_with_200_or_503_retry_after(
    admission_gateway: Gateway,
) -> None:
    async with aiohttp.ClientSession() as session:
        results = await asyncio.gather(
            *(post(session, admission_gateway, "web", "crowded", max_tokens=5) for _ in range(40))
        )
    statuses = Counter(status for status, _, _ in results)
    assert set(statuses) == {200, 503}, statuses
    assert statuses[200] >= 8  # two in flight and six queued were served
    for status, headers, body in results:
        if status == 503:
            assert int(headers["retry-after"]) >= 1
            assert body["error"]["code"] == "model_overloaded"


# The work of a request on `fair`, in tokens: a word a token, and `max_tokens` more.
MAX_TOKENS = 8
GOLD_WORDS, IRON_WORDS = 4, 16
GOLD_WORK, IRON_WORK = GOLD_WORDS + MAX_TOKENS, IRON_WORDS + MAX_TOKENS  # 12 and 24
SHARES = {"gold": 3, "iron": 1}
# Start-time fair queuing's bound: while both are backlogged, the work each was given,
# over its share, differs by at most one request of each (docs/admission-algorithm.md).
MOST_AHEAD = GOLD_WORK / SHARES["gold"] + IRON_WORK / SHARES["iron"]


def prompt(who: str, words: int) -> list[dict[str, str]]:
    """A prompt of `words` words, the first naming `who` (for the gated upstream)."""
    return [{"role": "user", "content": " ".join([who] + ["weather"] * (words - 1))}]


async def _holds(condition: bool) -> bool:
    return condition


class FairLine:
    """The `fair` model, one request at a time, as the gateway accounts for it.

    `hold` puts a request of `web`'s on the one slot, held upstream, so that what is sent
    next queues whole before anything is dispatched. Each `step` lets the request held
    upstream finish, which dispatches the next one, and reads `gateway_tokens_total`
    until the gateway has charged it: the tenant it charged is the one whose request
    went upstream at the step before. Every wait is for a state; nothing is timed.
    """

    def __init__(self, session: aiohttp.ClientSession, gw: Gateway, gate: GatedUpstream) -> None:
        self.session, self.gw, self.gate = session, gw, gate
        self.charged: dict[str, float] = {}
        self.sent: list[asyncio.Task[tuple[int, dict[str, str], dict[str, Any]]]] = []

    async def tokens(self) -> dict[str, float]:
        """The tokens the gateway charged each tenant on `fair` so far."""
        async with self.session.get(f"{self.gw.ops_url}/metrics") as response:
            exposition = await response.text()
        found: dict[str, float] = {}
        for family in text_string_to_metric_families(exposition):
            for sample in family.samples:
                if sample.name == "gateway_tokens_total" and sample.labels["model"] == "fair":
                    who = sample.labels["tenant"]
                    found[who] = found.get(who, 0.0) + sample.value
        return found

    async def queued(self) -> float:
        async with self.session.get(f"{self.gw.ops_url}/metrics") as response:
            lines = (await response.text()).splitlines()
        prefix = 'gateway_admission_queued{model="fair",'
        return sum(float(line.split()[-1]) for line in lines if line.startswith(prefix))

    def send(self, who: str, words: int, count: int) -> None:
        for _ in range(count):
            request = post(
                self.session, self.gw, who, "fair", prompt(who, words), max_tokens=MAX_TOKENS
            )
            self.sent.append(asyncio.create_task(request))

    async def queue(self, who: str, words: int, count: int) -> None:
        """Send `count` requests of `who`'s and wait until they are all queued."""
        waiting = await self.queued() + count
        self.send(who, words, count)
        await wait_until(lambda: self._queued_is(waiting))

    async def _queued_is(self, count: float) -> bool:
        return await self.queued() == count

    async def hold(self) -> None:
        """Put a request on the free slot and keep it there (upstream) until `step`."""
        self.charged = await self.tokens()
        assert await self.queued() == 0
        arrived = len(self.gate.arrived)
        self.send("web", GOLD_WORDS, 1)
        await wait_until(lambda: _holds(len(self.gate.arrived) == arrived + 1))

    async def step(self) -> tuple[str, int]:
        """Finish the request upstream; (tenant, tokens) the gateway charged for it."""
        before = self.charged
        self.gate.let_one_through()

        async def charged() -> bool:
            self.charged = await self.tokens()
            return self.charged != before

        await wait_until(charged)
        [(who, tokens)] = [
            (who, tokens - before.get(who, 0.0))
            for who, tokens in self.charged.items()
            if tokens != before.get(who, 0.0)
        ]
        return who, int(tokens)

    async def steps(self, count: int) -> list[str]:
        """`count` steps: the tenants charged, in order, each for its exact work."""
        work = {"web": GOLD_WORK, "gold": GOLD_WORK, "iron": IRON_WORK, "bulk": GOLD_WORK}
        order = []
        for _ in range(count):
            who, tokens = await self.step()
            assert tokens == work[who], (who, tokens)
            order.append(who)
        return order

    async def answered(self) -> None:
        """Every request sent was answered 200."""
        results = await asyncio.gather(*self.sent)
        assert [status for status, _, _ in results] == [200] * len(results)
        self.sent.clear()


def most_ahead(order: list[str], counts: dict[str, int]) -> float:
    """Over the prefixes of `order` while both tenants of `counts` still had requests
    queued, the largest gap between gold's work over its share and iron's."""
    work = {"gold": 0.0, "iron": 0.0}
    left = dict(counts)
    gap = 0.0
    for who in order:
        if min(left.values()) == 0:
            break
        work[who] += (GOLD_WORK if who == "gold" else IRON_WORK) / SHARES[who]
        left[who] -= 1
        gap = max(gap, abs(work["gold"] - work["iron"]))
    return gap


async def test_shares_split_work_lend_idle_share_and_reclaim_it(
    admission_gateway: Gateway, gated_upstream: tuple[str, GatedUpstream]
) -> None:
    gate = gated_upstream[1]
    async with aiohttp.ClientSession() as session:
        line = FairLine(session, admission_gateway, gate)
        start = len(gate.arrived)
        # Both busy: 24 short requests of gold's (share 3, 12 tokens each) and 4 long ones
        # of iron's (share 1, 24 tokens each) queue behind the held slot.
        await line.hold()
        await line.queue("gold", GOLD_WORDS, 24)
        await line.queue("iron", IRON_WORDS, 4)
        assert await line.steps(1) == ["web"]
        split = await line.steps(28)
        await line.answered()

        # Iron idle: gold alone, 30 requests, far more than its share.
        await line.hold()
        await line.queue("gold", GOLD_WORDS, 30)
        assert await line.steps(1) == ["web"]
        lent = await line.steps(7)  # the 8th is upstream now
        # Iron comes back while gold still has 22 queued.
        await line.queue("iron", IRON_WORDS, 4)
        [eighth] = await line.steps(1)
        back = await line.steps(26)
        await line.answered()

    # Work is split by shares, in tokens: every 7 dispatches in a row are 6 of gold's
    # (72 tokens) and 1 of iron's (24), so gold gets 3 tokens to iron's 1, not 3 requests.
    print(f"split, in dispatch order: {' '.join(split)}")
    for i in range(0, 28, 7):
        assert Counter(split[i : i + 7]) == {"gold": 6, "iron": 1}, split
    assert most_ahead(split, {"gold": 24, "iron": 4}) <= MOST_AHEAD
    # The idle share is lent: gold's requests went upstream one after the other, each
    # as soon as the slot was free (`step` waits for nothing else), with no slot kept
    # back for iron.
    assert [*lent, eighth] == ["gold"] * 8
    # ... and reclaimed when iron comes back: its first request is the very next one
    # dispatched (gold's borrowing left no debt to wait out), and from then on each gets
    # its share again, no more (iron's idle time earned it no credit either).
    print(f"back, in dispatch order: {' '.join(back)}")
    assert back[0] == "iron", back
    assert Counter(back) == {"gold": 22, "iron": 4}
    assert most_ahead(back, {"gold": 22, "iron": 4}) <= MOST_AHEAD
    # What the gateway charged, step by step, is what reached the upstream, in order.
    assert gate.arrived[start:] == ["web", *split, "web", *lent, eighth, *back]


async def test_online_waits_little_while_batch_absorbs_the_wait(
    admission_gateway: Gateway, gated_upstream: tuple[str, GatedUpstream]
) -> None:
    gate = gated_upstream[1]
    async with aiohttp.ClientSession() as session:
        line = FairLine(session, admission_gateway, gate)
        await line.hold()
        # Batch requests queue first, online ones after them.
        await line.queue("bulk", GOLD_WORDS, 6)
        await line.queue("web", GOLD_WORDS, 6)
        assert await line.steps(1) == ["web"]  # the request that held the slot
        order = await line.steps(12)
        await line.answered()
    # Online waits only for the slot in flight; batch waits for every online request,
    # even those that arrived after it, and is still served.
    assert order == ["web"] * 6 + ["bulk"] * 6


async def test_no_first_token_in_time_falls_back_to_the_small_model(
    admission_gateway: Gateway,
) -> None:
    async with aiohttp.ClientSession() as session:
        status, headers, body = await post(
            session, admission_gateway, "web", "big", LONG, stream=True, max_tokens=5
        )
    assert status == 200
    assert headers["x-gateway-fallback"] == "big->small; reason=ttft_timeout"
    assert '"model":"small"' in body["sse"]
    assert body["sse"].rstrip().endswith("data: [DONE]")


async def test_predicted_wait_routes_to_the_fallback_up_front(admission_gateway: Gateway) -> None:
    async with aiohttp.ClientSession() as session:
        # Learn how long `big` takes for 20 tokens (about 0.8 s), with no deadline.
        first, _, served = await post(session, admission_gateway, "web", "big", max_tokens=20)
        assert (first, served["model"]) == (200, "big")
        status, headers, body = await post(
            session, admission_gateway, "web", "big", max_tokens=20,
            headers={"x-request-timeout": "0.4"},
        )  # fmt: skip
    assert status == 200
    assert body["model"] == "small"
    assert headers["x-gateway-fallback"] == "big->small; reason=predicted_wait"


async def test_a_deadline_nothing_can_meet_is_504(admission_gateway: Gateway) -> None:
    async with aiohttp.ClientSession() as session:
        status, _, body = await post(
            session, admission_gateway, "web", "strict", max_tokens=20,
            headers={"x-request-timeout": "0.2"},
        )  # fmt: skip
    assert status == 504
    assert body["error"]["code"] == "deadline_exceeded"


async def test_retry_budget_holds_when_every_replica_fails(
    admission_gateway: Gateway, failing_upstream: tuple[list[str], Counter[str]]
) -> None:
    _, hits = failing_upstream
    hits.clear()
    async with aiohttp.ClientSession() as session:
        results = [await post(session, admission_gateway, "web", "failing") for _ in range(40)]
    assert all(status == 503 for status, _, _ in results)
    assert all("retry-after" in headers for _, headers, _ in results)
    # 40 first attempts, and retries only within the budget: 20% of the requests plus
    # 0.1 a second over the 10 s window. Without a budget: up to 120 calls.
    assert 40 <= sum(hits.values()) <= 40 + 0.2 * 40 + 1


async def test_idempotency_key_returns_the_stored_answer(admission_gateway: Gateway) -> None:
    once = {"idempotency-key": f"order-{time.time_ns()}"}
    async with aiohttp.ClientSession() as session:
        first = await post(session, admission_gateway, "web", "small", headers=once)
        again = await post(session, admission_gateway, "web", "small", headers=once)
        other = await post(session, admission_gateway, "web", "small", LONG, headers=once)
    assert first[0] == again[0] == 200
    assert again[2]["id"] == first[2]["id"]  # ids are random per run: this was not rerun
    assert again[1]["idempotent-replayed"] == "true"
    assert other[0] == 422


async def test_client_disconnect_cancels_upstream_and_frees_the_slot(
    admission_gateway: Gateway,
) -> None:
    body = {"model": "solo", "messages": LONG, "max_tokens": 200, "stream": True}
    async with aiohttp.ClientSession() as session:
        response = await session.post(
            f"{admission_gateway.base_url}/chat/completions", json=body, headers=key("web")
        )
        await response.content.readline()
        assert await in_flight(session, admission_gateway, "solo") == 1
        response.close()  # the client goes away mid-stream

        async def freed() -> bool:
            return await in_flight(session, admission_gateway, "solo") == 0

        await wait_until(freed)
        status, _, _ = await post(session, admission_gateway, "web", "solo", max_tokens=2)
    assert status == 200


async def in_flight(session: aiohttp.ClientSession, gw: Gateway, model_name: str) -> float:
    async with session.get(f"{gw.ops_url}/metrics") as response:
        for line in (await response.text()).splitlines():
            if line.startswith(f'gateway_admission_in_flight{{model="{model_name}"}}'):
                return float(line.split()[-1])
    raise AssertionError("no in-flight gauge")
