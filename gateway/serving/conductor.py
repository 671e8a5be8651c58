"""A request conducted below the wire: the one place that knows the order of its steps.

    authenticate -> read and parse (the wire's) -> authorize -> plan -> Idempotency-Key
    -> limit -> admit and dispatch (fallback chain, replicas, retries) -> settle -> record

`conduct` is the one entry, for every wire, whole answers and streams alike. The HTTP
layer (`gateway.api.exchange`) hands it an `Incoming`: what HTTP carried (the key, the
headers that ask for a priority, a timeout or idempotency) and the wire's own steps,
which it calls at their turn (read and decode the body, parse it, render a whole
answer, the client's error for a refusal). It returns a whole answer rendered (a
`Reply`) or a `Stream` open, which the HTTP layer writes out. Nothing here speaks HTTP:
the client is something that may be `gone`, a refusal is one of `serving.errors`, and
the answer is data: completions, who served them, what they used, what the client is
told of it.

Every request ends in its `RequestRecord`: this module fills in who served it and what
it used; the HTTP layer finishes it with the status it answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NoReturn, Protocol

from gateway.admission import DeadlineExceeded, Overloaded, Shed
from gateway.admission.queue import BATCH_API_CLASS
from gateway.backends.base import UpstreamError, UpstreamTimeout
from gateway.config.schema import Price
from gateway.inference.prompt import PromptRefused
from gateway.inference.structured import output_problem
from gateway.inference.tokens import (
    estimate_request_tokens,
    estimate_tokens,
    most_request_tokens,
    most_tokens,
)
from gateway.inference.types import (
    Completion,
    Delta,
    InferenceRequest,
    RequestKind,
    ResponseFormat,
    UpstreamCall,
    Usage,
    UsageMeter,
)
from gateway.observability import metrics
from gateway.observability.access import RequestRecord
from gateway.observability.logging import redact
from gateway.observability.tracing import Attribute
from gateway.ratelimit.decisions import Decision, Reservation
from gateway.ratelimit.errors import LimiterUnavailable, UnknownTenant
from gateway.serving.auth import Identity
from gateway.serving.chain import MissingCapability, check_context, fallback_chain
from gateway.serving.dispatch import DeadlineMissed, Fallback, Served, Work, fallback_header
from gateway.serving.errors import (
    InvalidRequest,
    InvalidStructuredOutput,
    ModelNotAllowed,
    NotServed,
    RateLimited,
    UnknownModel,
    WrongModelKind,
)
from gateway.serving.fanout import gather_all, interleave, split
from gateway.serving.idempotency import UNCLAIMED, IdempotencyClaim, Reply, claim
from gateway.serving.runtime import Runtime
from gateway.transport.errors import APIError
from gateway.transport.streaming import ClientGone
from gateway.upstream.failover import NoReplicaLeft
from gateway.upstream.route import ModelRoute

# A client's model name, as an error or a log repeats it, at most: a 1 MB name made a
# 1 MB error.
MAX_SHOWN_MODEL = 256
# How far past the cut a secret's end is looked for: a password URL cut before its `@`
# is no longer one to the detectors. (Redacting a whole 1 MB name took 60 ms.)
_REDACTED_PAST_THE_CUT = 1024


def shown_model(name: str) -> str:
    """A model name a client sent, as an error or a log line may repeat it: redacted
    first, then cut to `MAX_SHOWN_MODEL` characters ("..." after a cut)."""
    if len(name) <= MAX_SHOWN_MODEL:
        return redact(name)
    shown = redact(name[: MAX_SHOWN_MODEL + _REDACTED_PAST_THE_CUT])
    return shown[:MAX_SHOWN_MODEL] + "..."


# Left-out tool types a header names at most: 512 types of 64 characters made a 33 KB
# header, past what proxies take (4 to 8 KB).
MAX_OMITTED_IN_HEADER = 16

# A stream's usage goes into the usage journal every this many tokens: what it is
# recorded at if the gateway dies mid-stream is at most this much short. A line costs
# about 2.6 µs; a piece, about 25.
JOURNAL_EVERY_TOKENS = 16

# A body larger than this, bound for a model outside the cluster, is scanned for
# sensitive data in a thread, not on the event loop; and its chat template renders it in
# a thread too.
SCAN_ON_THE_LOOP_BYTES = 16 * 1024


async def upstream_call(
    route: ModelRoute, request: InferenceRequest, body_bytes: int
) -> UpstreamCall:
    """`route.upstream_call(request)`: for a body over `SCAN_ON_THE_LOOP_BYTES` whose
    prompt the gateway renders, in a thread (a chat template renders a 1 MB conversation
    in 0.2 to 0.5 s: issue 42's hostile review), so that the event loop keeps its turns."""
    if body_bytes > SCAN_ON_THE_LOOP_BYTES and route.backend.renders_prompt:
        return await asyncio.to_thread(route.upstream_call, request)
    return route.upstream_call(request)


# What the dispatcher may raise instead of answering.
_DISPATCH_ERRORS = (UpstreamError, NoReplicaLeft, DeadlineMissed, Overloaded)
# Failures that end a request by its time while a replica may still be computing it.
_CUT_BY_TIME = (DeadlineMissed, UpstreamTimeout)


class Client(Protocol):
    """The client a request is conducted for, as far as the conductor cares: whether it
    has left, and its leaving cancelling the request from when the request holds
    something to give back (`gateway.transport.streaming.DisconnectWatch` is one)."""

    @property
    def gone(self) -> bool: ...

    def cancel_when_gone(self) -> None:
        """From now on, the client leaving cancels the calling task."""
        ...

    def stop(self) -> None:
        """Stop watching the client (a whole answer is about to go out)."""
        ...


class Incoming(Protocol):
    """A request as the HTTP layer hands it to `Conductor.conduct`: what HTTP carried,
    and the wire's own steps, which the conductor calls at their turn."""

    @property
    def record(self) -> RequestRecord:
        """The request's record, opened when it arrived."""
        ...

    @property
    def credentials(self) -> str | None:
        """The key the caller sent, as the wire carries it."""
        ...

    @property
    def priority(self) -> str | None:
        """`x-priority`, as sent."""
        ...

    @property
    def timeout(self) -> str | None:
        """`x-request-timeout`, as sent."""
        ...

    @property
    def idempotency_key(self) -> str | None:
        """`Idempotency-Key`, as sent."""
        ...

    @property
    def batch_id(self) -> str | None:
        """The batch this request is a line of (None: a client's own request): it runs
        in the batch class, below every online one, priced with the batch discount."""
        ...

    async def read(self, limit: int) -> tuple[Mapping[str, Any], int]:
        """The body read (refused past `limit` bytes) and decoded: its data, its size."""
        ...

    def requested_model(self, data: Mapping[str, Any]) -> str:
        """The model the body names."""
        ...

    async def parse(
        self, identity: Identity, route: ModelRoute, data: Mapping[str, Any], size: int
    ) -> InferenceRequest:
        """The wire's parse of the body, for `route`'s model."""
        ...

    def fingerprint(self, data: Mapping[str, Any]) -> str:
        """What tells this request from another under one Idempotency-Key."""
        ...

    def client(self) -> Client:
        """The client, watched from now on for leaving."""
        ...

    async def render(self, answer: Answer, identity: Identity) -> Reply:
        """A whole answer to `identity` in the wire's format."""
        ...

    def refusal(self, exc: Exception) -> APIError:
        """What the client is told of a refusal (a 500 for what nobody foresaw)."""
        ...


@dataclass(frozen=True, slots=True)
class Ask:
    """A request as its wire parsed it, and what its caller asked of its serving."""

    identity: Identity
    route: ModelRoute
    inference: InferenceRequest
    record: RequestRecord
    # The body as parsed: which of its fields a refusal of `max_tokens` names.
    data: Mapping[str, Any]
    # `x-priority` and `x-request-timeout`, as sent (None: not sent).
    priority: str | None = None
    timeout: str | None = None
    # The body's size: a large one bound for an external model is scanned off the loop.
    body_bytes: int = 0
    # The batch it is a line of (`Incoming.batch_id`).
    batch_id: str | None = None


@dataclass(frozen=True, slots=True)
class _PartPlan:
    """One part of a request, ready to dispatch: the models it may go to, the call to the
    first, what each is sent where outbound sanitization masked it, its cost in tokens."""

    chain: list[ModelRoute]
    call: UpstreamCall
    outbound: Sequence[InferenceRequest] | None
    cost: int


@dataclass(frozen=True, slots=True)
class Plan:
    """A request planned: its parts (usually one; `n` choices, a completion's prompts and
    an embedding's batches are several), each with its chain and cost."""

    ask: Ask
    inference: InferenceRequest
    parts: list[InferenceRequest]
    planned: list[_PartPlan]
    priority: str
    deadline: float

    @property
    def cost(self) -> int:
        """The tokens the request reserves: every part's prompt and completion reserve."""
        return sum(plan.cost for plan in self.planned)


@dataclass(slots=True)
class Answer:
    """A whole answer: `completions[i]` answers `parts[i]`; `model` served the first."""

    parts: list[InferenceRequest]
    completions: list[Completion]
    model: str
    usage: Usage
    # What the client is told of how it was served (request id, rate-limit headers,
    # queue wait, fallbacks, tools left out).
    headers: dict[str, str]


class Conductor:
    """Conducts the requests of one running gateway (`Runtime`)."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    async def conduct(self, incoming: Incoming, identity: Identity | None = None) -> Reply | Stream:
        """Serve one request, whatever its wire and whether it streams: authenticate,
        read and parse it (the wire's steps), authorize and plan it, claim its
        Idempotency-Key, then limit, admit, dispatch and settle. A whole answer comes
        back rendered by its wire (or the stored answer of its key), a stream open. A
        refusal up to admission counts against the tenant's request limit. `identity`:
        who sends it, known already (a batch's line: the key that made the batch)."""
        record = incoming.record
        if identity is None:
            identity = await self._runtime.auth.authenticate(incoming.credentials)
        record.tenant, record.key_id = identity.name, identity.key_id
        try:
            plan = await self._read_and_plan(identity, incoming)
            claimed = await self._claim(identity, incoming, plan)
        except ClientGone:
            raise  # left while it sent its body
        except Exception as exc:
            # Reading, parsing and checking it cost the gateway work the client chose.
            refusal = incoming.refusal(exc)
            refusal.headers.update(await self.count_refused(identity, record, refusal.status))
            if refusal is exc:
                raise
            raise refusal from exc
        if isinstance(claimed, Reply):
            # The stored answer to an earlier run. It asks for no inference, but its body
            # was read and parsed: it counts as one request, as count_tokens does.
            claimed.headers.update(await self.count(identity, plan.ask.route.name))
            record.replay_of = claimed.headers.get("x-request-id", "")
            return claimed
        try:
            if plan.inference.stream:
                return await self._opened(plan, incoming.client())
            reply = await self._answered(plan, incoming)
        except BaseException:
            # Whatever failed, cancels included, a retry with the same key must run.
            await claimed.abandon()
            raise
        await claimed.complete(reply)
        return reply

    async def _read_and_plan(self, identity: Identity, incoming: Incoming) -> Plan:
        data, size = await incoming.read(self._runtime.config.gateway.server.max_body_bytes)
        route = self.authorize(identity, incoming.requested_model(data), incoming.record)
        inference = await incoming.parse(identity, route, data, size)
        ask = Ask(
            identity, route, inference, incoming.record, data,
            incoming.priority, incoming.timeout, size, incoming.batch_id,
        )  # fmt: skip
        return await self.plan(ask)

    async def _claim(
        self, identity: Identity, incoming: Incoming, plan: Plan
    ) -> IdempotencyClaim | Reply:
        key = incoming.idempotency_key
        if key is None or plan.inference.stream:
            return UNCLAIMED
        fingerprint = incoming.fingerprint(plan.ask.data)
        return await claim(self._runtime.idempotency, identity, key, fingerprint)

    async def _answered(self, plan: Plan, incoming: Incoming) -> Reply:
        client = incoming.client()
        try:
            answer = await self.answer(plan, client)
        finally:
            client.stop()  # before the answer goes out: its end looks like a disconnect
        return await incoming.render(answer, plan.ask.identity)

    async def _opened(self, plan: Plan, client: Client) -> Stream:
        # The stream answers after its first piece, so a failure up to here is a plain
        # refusal (and another replica or model could still be tried).
        try:
            return await self.stream(plan, client)
        except BaseException:
            client.stop()
            raise

    def authorize(
        self, identity: Identity, model: str, record: RequestRecord | None = None
    ) -> ModelRoute:
        """The model a request names (or an alias of), which the caller's tenant may use;
        `record` takes its name as soon as it is known."""
        runtime = self._runtime
        route = runtime.routes.get(model) or runtime.routes.get(
            runtime.aliases.resolve(identity.name, model) or ""
        )
        if route is None:
            raise UnknownModel(model)
        if record is not None:
            record.model = route.name
            if route.name != model:
                record.alias = shown_model(model)
        if not identity.may_use(route.name):
            raise ModelNotAllowed(model)
        return route

    async def plan(self, ask: Ask) -> Plan:
        """Check a parsed request against its model and plan each of its parts: the
        models it may fall back to, the call each is sent, what it costs."""
        runtime, route, inference, record = self._runtime, ask.route, ask.inference, ask.record
        _check_model_kind(route, inference)
        record.stream = inference.stream
        if runtime.config.gateway.server.log_prompts:
            record.prompt = _logged_prompt(inference)
        limit = route.config.max_tokens_limit
        if inference.params.max_tokens > limit:
            if route.config.max_tokens_policy == "refuse":
                field = next(
                    (f for f in ("max_completion_tokens", "max_output_tokens") if ask.data.get(f)),
                    "max_tokens",
                )
                raise InvalidRequest(f"`{field}` may be at most {limit} for `{route.name}`.", field)
            # Clamped: served with the limit, reserved at it, and an answer that reaches it
            # is cut at max_tokens (the finish reason compares with params.max_tokens).
            inference = replace(
                inference,
                params=replace(inference.params, max_tokens=limit),
                requested_max_tokens=None if inference.requested_max_tokens is None else limit,
            )
        identity = ask.identity
        if ask.batch_id is None:
            priority = record.priority = self._priority(identity, ask.priority)
        else:
            priority = record.priority = BATCH_API_CLASS
            record.batch_id = ask.batch_id
        record.max_tokens = inference.params.max_tokens
        deadline = _deadline(route, ask.timeout)
        embeddings = route.config.capabilities.embeddings
        parts = split(inference, embeddings.max_batch if embeddings is not None else 1)
        # The chain's context check takes the longest part (a completion's longest prompt).
        longest = parts[0] if len(parts) == 1 else max(parts, key=estimate_request_tokens)
        chain = fallback_chain(runtime.routes, identity, route, longest)
        planned = [
            await self._plan_part(identity, route, chain, part, record, ask.body_bytes)
            for part in parts
        ]
        return Plan(ask, inference, parts, planned, priority, deadline)

    async def count(self, identity: Identity, model: str = "") -> dict[str, str]:
        """Count a request that asks for no inference (`count_tokens`, a stored response
        read, a stored answer replayed) against the tenant's request limit, `model`'s
        when it names one, and the managed key's own (a key's rate covers all it sends,
        so that one key cannot spend its tenant's shared limit past its own):
        `RateLimited` when one is spent. Cheap as these are, a tenant could otherwise
        send them without end. Returns the rate-limit headers its answer carries, as
        every counted answer does."""
        limiter = self._runtime.limiter
        decision = await limiter.admit(
            identity.name, model, 0, holds_slot=False, key=identity.key_quota
        )
        if not decision.allowed:
            raise RateLimited(decision)
        if decision.reservation is not None:
            limiter.settle(decision.reservation, 0)
        return decision.headers

    async def count_refused(
        self, identity: Identity, record: RequestRecord, status: int
    ) -> dict[str, str]:
        """Count a request refused before admission with `status` (a 4xx of its own
        making, or a 500 the gateway met on it) against its tenant's request limit:
        reading, parsing and checking it cost the gateway work the client chose, so a
        tenant cannot send bad requests without end. Returns the rate-limit headers the
        refusal carries (none if the limiter cannot tell: Redis down, fail-closed);
        `RateLimited` once the limit (the tenant's, or the key's own) is spent, to take
        the refusal's place. A 429 or a 503 (the limiter or capacity) and a 504 are not
        counted."""
        if status < 400 or status in (429, 503, 504):
            return {}
        model = record.model if record.model in self._runtime.routes else ""
        with contextlib.suppress(LimiterUnavailable, UnknownTenant):
            return await self.count(identity, model)
        return {}

    async def answer(self, plan: Plan, client: Client) -> Answer:
        """Limit, admit and dispatch every part, settle what they used: the whole answer.
        Once admitted, the caller's task is cancelled when its client leaves (`ClientGone`
        then)."""
        admitted = await self._admit(plan)
        # Only now: a cancel while the limiter's call is out would lose what Redis took.
        client.cancel_when_gone()
        admitted.journal_dispatch()
        answered: set[int] = set()
        dispatcher = self._runtime.dispatcher
        # What the parts answered so far cost, each at the model that served it.
        charges: list[Charge] = []

        async def dispatch(index: int, work: Work) -> tuple[Completion, Served]:
            completion, served = await dispatcher.complete(work)
            if completion.usage.prompt_tokens == 0:
                completion.usage.prompt_tokens = work.attempts[-1].call.prompt_estimate
            charges.append(admitted.charge(served.route.name, completion.usage))
            answered.add(index)
            return completion, served

        dispatched = time.monotonic()
        try:
            if client.gone:
                raise ClientGone
            results = await gather_all([dispatch(i, work) for i, work in enumerate(admitted.works)])
        except BaseException as exc:
            if client.gone or isinstance(exc, _CUT_BY_TIME):
                # Left, or cut at its deadline (which the client may choose), while its
                # parts were with a replica: they pay what the replica did.
                pending = [w for i, w in enumerate(admitted.works) if i not in answered]
                charges += admitted.cut_charges(pending, whole=True)
            admitted.settle(charges)
            admitted.failed(exc, client, dispatched)
        completions = [completion for completion, _ in results]
        served = [part for _, part in results]
        usage = completions[0].usage
        if len(completions) > 1:
            usage = Usage.sum_of(c.usage for c in completions)
        model = served[0].route.name
        problem = _structured_output_problem(plan.parts[0].options.response_format, completions)
        # An answer the gateway rejects is not sold: its tokens count against the rate
        # limits (the replica made them), its price is not charged.
        admitted.settle(charges if problem is None else [c.unpriced() for c in charges])
        admitted.served_by(served, usage)
        record = admitted.record
        if record.trace is not None:
            record.finish_reasons = tuple(c.finish_reason for c in completions)
        if problem is not None:
            raise InvalidStructuredOutput(model, problem)
        admitted.journal(200)  # answered: recorded so, should the gateway die sending it
        return Answer(plan.parts, completions, model, usage, admitted.headers(served[0]))

    async def stream(self, plan: Plan, client: Client) -> Stream:
        """Limit, admit and dispatch every part until each has its first piece (or has
        ended): a failure up to here is a plain refusal, and another replica or model
        could still be tried. The rest comes through the `Stream`, which settles when
        it closes. Once admitted, the caller's task is cancelled when its client leaves,
        until then."""
        admitted = await self._admit(plan)
        client.cancel_when_gone()  # only now, as for a whole answer
        admitted.journal_dispatch()
        dispatched = time.monotonic()
        dispatcher = self._runtime.dispatcher
        try:
            if client.gone:
                raise ClientGone
            opened = await gather_all([dispatcher.stream(w) for w in admitted.works], _close)
        except BaseException as exc:
            # Left, or cut at a deadline, while a replica computed its prompt: that prompt
            # is paid for.
            cut = client.gone or isinstance(exc, _CUT_BY_TIME)
            admitted.settle(admitted.cut_charges(admitted.works, whole=False) if cut else [])
            admitted.failed(exc, client, dispatched)
        return Stream(admitted, opened, plan)

    async def _admit(self, plan: Plan) -> _Admitted:
        """Take the request's cost from its tenant's limits; its parts made into work."""
        ask = plan.ask
        identity = ask.identity
        budgeted = bool(identity.tenant.budgets or identity.key_budgets)
        runtime = self._runtime
        prices = (
            runtime.config.gateway.prices.models if ask.batch_id is None else runtime.batch_prices
        )
        trace = ask.record.trace
        asked = 0.0 if trace is None else time.monotonic()
        decision = await self._runtime.limiter.admit(
            identity.name,
            ask.route.name,
            plan.cost,
            plan.deadline,
            # A batch line takes no slot of the tenant's `max_concurrent`: its own
            # concurrency is `batch.max_concurrent_lines`, so that a batch never leaves
            # the tenant's online requests without a slot.
            holds_slot=ask.batch_id is None,
            reserve_micros=_most_spend(plan, prices) if budgeted else 0,
            key=identity.key_quota,
        )
        if trace is not None:
            trace.step("gateway.ratelimit", asked, _limited(decision, plan.cost))
        if not decision.allowed:
            raise RateLimited(decision)
        admitted = _Admitted(self._runtime, ask.route, [], decision, ask.record, prices, identity)
        for part, part_plan in zip(plan.parts, plan.planned, strict=True):
            work = Work(
                part, part_plan.chain, identity.name, identity.tenant.share, plan.priority,
                part_plan.cost, plan.deadline, part_plan.call, outbound=part_plan.outbound,
                gate=functools.partial(admitted.gate, part, len(admitted.works)),
                trace=trace,
            )  # fmt: skip
            admitted.works.append(work)
        return admitted

    async def _plan_part(
        self,
        identity: Identity,
        route: ModelRoute,
        chain: list[ModelRoute],
        part: InferenceRequest,
        record: RequestRecord,
        body_bytes: int,
    ) -> _PartPlan:
        runtime = self._runtime
        names = [r.name for r in chain]
        scan = functools.partial(
            runtime.outbound.prepare, identity.name, identity.tenant, names, part,
            record.request_id,
        )  # fmt: skip
        if body_bytes > SCAN_ON_THE_LOOP_BYTES and runtime.outbound.scans(names):
            # Scanning takes 0.3 to 1.7 ms a KB: a large body would hold the event loop,
            # and every other request with it, for up to seconds (the hostile review of
            # issue 40: 900 KB of digits held it 1.8 s). In a thread the loop keeps its
            # turns (the interpreter switches every 5 ms) while the scan runs.
            outbound = await asyncio.to_thread(scan)
        else:
            outbound = scan()
        if outbound is not None:  # an external model in the chain: what leaves is sanitized
            chain = [runtime.routes[name] for name in outbound.models]
        sent = part if outbound is None else outbound.requests[0]
        call = await upstream_call(route, sent, body_bytes)
        check_context(route, call.prompt_estimate, part)
        return _PartPlan(
            chain,
            call,
            None if outbound is None else outbound.requests,
            call.prompt_estimate + self._completion_reserve(part),
        )

    def _priority(self, identity: Identity, asked: str | None) -> str:
        """The tenant's class, or a lower one the request asks for (never a higher one)."""
        own = identity.tenant.priority
        if asked is None:
            return own
        classes = self._runtime.config.gateway.admission.classes
        if asked not in classes:  # `batch-api` too: a Batch API line's alone
            raise InvalidRequest(f"`x-priority` must be one of {', '.join(classes)}.", "x-priority")
        return asked if classes.index(asked) > classes.index(own) else own

    def _completion_reserve(self, inference: InferenceRequest) -> int:
        """Completion tokens to reserve: the client's max_tokens, else a configured estimate."""
        if inference.requested_max_tokens is not None:
            return inference.requested_max_tokens
        estimate = self._runtime.config.gateway.ratelimit.completion_tokens_estimate
        return min(inference.params.max_tokens, estimate)


@dataclass(slots=True)
class _Admitted:
    """One admitted request on its way: what it took from the limits, its parts' work."""

    runtime: Runtime
    route: ModelRoute
    # One per part of the request (`gateway.serving.fanout`): usually just one.
    works: list[Work]
    decision: Decision
    record: RequestRecord
    # The price table: what a request spends.
    prices: Mapping[str, Price]
    identity: Identity
    # What each fallback model's own limits and budgets took (`gate`), by model, and
    # the budget headers they answered.
    fallback_takes: dict[str, list[Reservation]] = field(default_factory=dict)
    fallback_budgets: dict[str, dict[str, str]] = field(default_factory=dict)
    # The fallbacks those refused, as the record names them, and as the client is told.
    refused: list[str] = field(default_factory=list)
    refused_header: str = ""

    @property
    def work(self) -> Work:
        """The first part: the request itself, unless it has several."""
        return self.works[0]

    def journal_dispatch(self) -> None:
        """`journal` the request as it goes to its replicas: its prompt, nothing more."""
        if self.runtime.usage is not None:
            self.journal(0, sum(w.first_call.prompt_estimate for w in self.works))

    def journal(self, status: int = 0, prompt_tokens: int | None = None) -> None:
        """The request, as far as it has got, into the usage journal (`status` 0: still
        on its way): if the gateway dies before the request ends, it is recorded from
        this (`UsageLedger.in_flight`)."""
        usage = self.runtime.usage
        if usage is not None:
            usage.in_flight(self.record, status, prompt_tokens)

    async def gate(self, part: InferenceRequest, index: int, to: int) -> bool:
        """Whether part `index` may fall back to its chain's model `to`: that model's own
        limits and budgets (those of the tenant and the key that name it) take what the
        part can cost there, as the request's admission took it for the model it named.
        A refusal is named in the record; the part stays where it is."""
        work = self.works[index]
        route = work.chain[to]
        try:
            call = work.call_for(to, route)
        except PromptRefused:
            # The fallback's own template refuses the conversation: the work stays with
            # the failure it had, which is the client's to hear (not the fallback's 400).
            self._refuse(work, to, "template")
            return False
        identity = self.identity
        budgeted = bool(identity.tenant.budgets or identity.key_budgets)
        limiter = self.runtime.limiter
        try:
            decision = await limiter.admit(
                identity.name,
                route.name,
                call.prompt_estimate + work.cost_tokens - work.first_call.prompt_estimate,
                work.deadline,
                holds_slot=False,
                reserve_micros=_most_spend_at(part, call, self.prices.get(route.name))
                if budgeted
                else 0,
                key=identity.key_quota,
                model_only=True,
            )
        except (LimiterUnavailable, UnknownTenant):
            decision = Decision(allowed=False)  # its limits cannot be told: not taken
        if not decision.allowed:
            self._refuse(work, to, decision.refused_by or "limiter_unavailable")
            return False
        if decision.reservation is not None:
            self.fallback_takes.setdefault(route.name, []).append(decision.reservation)
        budgets = {k: v for k, v in decision.headers.items() if k.startswith("x-budget-")}
        if budgets:
            self.fallback_budgets[route.name] = budgets
        return True

    def _refuse(self, work: Work, to: int, why: str) -> None:
        """Name a fallback not taken, and why, in the record and to the client."""
        route = work.chain[to]
        refusal = f"{work.chain[to - 1].name}->{route.name}:refused_{why}"
        self.refused.append(refusal)
        self.record.fallbacks.append(refusal)
        self.refused_header = f"{route.name}; reason={why}"

    def settle(self, charges: Sequence[Charge]) -> None:
        """Settle what the parts used and cost (micro-units), each at the model that ran
        it: the tenant's and the key's limits and budgets take it all; a model's own
        (its limits, the budgets that name it) take what it ran, the model the request
        named giving back what a fallback ran. The spend goes into the metrics."""
        record = self.record
        named = self.route.name
        used = spent = prompt = moved_tokens = moved_micros = 0
        cut_at = ""
        for charge in charges:  # one pass: this runs for every request
            used += charge.tokens
            spent += charge.micros
            prompt += charge.prompt
            if charge.cut and not cut_at:
                cut_at = charge.model
            if charge.model != named:
                moved_tokens += charge.tokens
                moved_micros += charge.micros
            if charge.micros > 0:
                metrics.labels(metrics.SPEND, self.work.tenant, charge.model).inc(charge.micros)
        record.cost_micros = spent
        if cut_at and not record.served_model:
            # Cut before any answer was seen (the client left, or its deadline passed):
            # the record says what it is charged for, at the model that ran it, so that
            # the ledger's figures by model add up as the counters' do.
            record.served_model = cut_at
            record.prompt_tokens = prompt
            record.completion_tokens = max(0, used - prompt)
        limiter = self.runtime.limiter
        reservation = self.decision.reservation
        if reservation is not None:  # None: the tenant has no limit on the model it named
            limiter.settle(reservation, used, spent)
            if moved_tokens or moved_micros:
                limiter.give_back(
                    reservation,
                    self.identity.name,
                    named,
                    self.identity.key_quota,
                    moved_tokens,
                    moved_micros,
                )
        if self.fallback_takes:
            for model, taken in self.fallback_takes.items():
                ran = [charge for charge in charges if charge.model == model]
                limiter.settle(taken[0], sum(c.tokens for c in ran), sum(c.micros for c in ran))
                for rest in taken[1:]:
                    limiter.settle(rest, 0, 0)
            self.fallback_takes.clear()

    def charge(self, model: str, usage: Usage) -> Charge:
        """What `usage` costs on `model`."""
        return Charge(model, usage.total_tokens, self.spend(model, usage), usage.prompt_tokens)

    def spend(self, model: str, usage: Usage) -> int:
        """What `usage` costs on `model`, in micro-units (0: the model has no price)."""
        price = self.prices.get(model)
        if price is None:
            return 0
        return price.cost_micros(
            usage.prompt_tokens, usage.cached_tokens or 0, usage.completion_tokens
        )

    def cut_charges(self, works: Sequence[Work], *, whole: bool) -> list[Charge]:
        """What parts cost that ended before their answer was seen (the client left, or
        the deadline passed), each at the model whose replica had it: nothing if none
        had it (still queued, or its replica failed: not the client's fault), else its
        prompt and, for a `whole` (non-streamed) answer, the most the replica can have
        generated in the time it ran (`LatencyTracker.most_generated`: the time over the
        model's measured time per token, at most its `max_tokens`). A stream is metered
        piece by piece: before its first piece it has generated nothing."""
        charges = []
        for work in works:
            attempt = work.cut_attempt
            if attempt is None:
                continue
            call = attempt.call
            generated = 0
            if whole:
                latency = attempt.route.resilience.latency
                generated = latency.most_generated(attempt.ran_s(), call.params.max_tokens)
            usage = Usage(call.prompt_estimate, generated)
            charges.append(replace(self.charge(attempt.route.name, usage), cut=True))
        return charges

    def headers(self, served: Served) -> dict[str, str]:
        headers = dict(self.decision.headers)
        headers["x-request-id"] = self.record.request_id
        headers["x-gateway-queue-ms"] = str(round(served.queued_s * 1000))
        fallback = served.header()
        if fallback is not None:
            headers["x-gateway-fallback"] = fallback
            # The budget the answer was charged to: the served model's own, if it has one.
            headers.update(self.fallback_budgets.get(served.route.name, {}))
        if self.refused_header:  # a fallback its own limits refused: never silently
            headers["x-gateway-fallback-refused"] = self.refused_header
        if self.work.request.omitted_tools:  # never left out silently
            headers["x-gateway-omitted-tools"] = omitted_header(self.work.request.omitted_tools)
        return headers

    def served_by(self, served: Sequence[Served], usage: Usage) -> None:
        """Fill the request's record with who served it (its first part's answer: the
        model, queue wait and fallbacks the client is told of) and what it used."""
        record = self.record
        first = served[0]
        record.served_model = first.route.name
        record.queue_wait_s = first.queued_s
        record.ttft_s = first.ttft_s
        record.prompt_tokens = usage.prompt_tokens
        record.completion_tokens = usage.completion_tokens
        record.cached_tokens = usage.cached_tokens or 0
        record.fallbacks = [*_moved(first.fallbacks), *self.refused]
        for part in served:
            for step in part.fallbacks:
                metrics.FALLBACKS.labels(step.source, step.target, step.reason.value).inc()

    def failed(self, exc: BaseException, client: Client, dispatched: float) -> NoReturn:
        """Raise what a failed dispatch means: `NotServed`, ClientGone for a cancel that
        the client's leaving caused (taken back), or `exc` itself."""
        if isinstance(exc, _DISPATCH_ERRORS):
            raise self.not_served(exc, dispatched) from exc
        if isinstance(exc, asyncio.CancelledError) and client.gone:
            task = asyncio.current_task()
            if task is not None and task.uncancel() == 0:  # nobody else cancelled it
                raise ClientGone from None
        raise exc

    def not_served(self, exc: Exception, dispatched: float) -> NotServed:
        """A request the dispatcher could not serve, with the rate limit headers; the time
        it spent queued first, if it was, goes in its record."""
        context = exc.__context__
        if isinstance(context, DeadlineExceeded):  # still queued at its deadline
            if context.waited_s:  # 0: the deadline had passed before it could queue
                self.record.queue_wait_s = context.waited_s
                self.record.queue_model = context.model
        elif isinstance(exc, Shed):  # queued, then gave way to a higher class
            self.record.queue_wait_s = time.monotonic() - dispatched
            self.record.queue_model = exc.model
        elif self.work.admissions:  # admitted (at once, or after a wait), then failed
            self.record.queue_model, self.record.queue_wait_s = self.work.admissions[-1]
        headers = dict(self.decision.headers)
        moves = self.work.fallbacks
        if moves:  # it fell back, then failed there: said, and recorded
            self.record.fallbacks = [*_moved(moves), *self.refused]
            headers["x-gateway-fallback"] = fallback_header(moves) or ""
        if self.refused_header:
            headers["x-gateway-fallback-refused"] = self.refused_header
        return NotServed(self.route.name, exc, headers)


def _limited(decision: Decision, cost: int) -> dict[str, Attribute]:
    """The limiter's decision, as its trace step shows it."""
    attributes: dict[str, Attribute] = {
        "gateway.ratelimit.allowed": decision.allowed,
        "gateway.ratelimit.reserved_tokens": cost,
    }
    if decision.refused_by is not None:
        attributes["gateway.ratelimit.refused_by"] = decision.refused_by
        attributes["gateway.ratelimit.of_key"] = decision.of_key
    return attributes


def _moved(fallbacks: Sequence[Fallback]) -> list[str]:
    """Moves along the chain as the record names them: `llm-large->llm-small:reason`."""
    return [f"{f.source}->{f.target}:{f.reason.value}" for f in fallbacks]


@dataclass(frozen=True, slots=True)
class Charge:
    """What one part of a request costs, at the model that ran it: tokens (prompt
    included), micro-units; `cut`: it ended before its answer was seen."""

    model: str
    tokens: int
    micros: int
    prompt: int
    cut: bool = False

    def unpriced(self) -> Charge:
        """The same tokens, at no price."""
        return replace(self, micros=0)


def _structured_output_problem(
    fmt: ResponseFormat | None, completions: Sequence[Completion]
) -> str | None:
    """What is wrong with the first answer that is not what `response_format` asks (None:
    nothing). An answer cut at its token limit is no answer to check: it goes out as cut
    (`length`), as OpenAI sends it, for the client to see why; nor are tool calls."""
    if fmt is None:
        return None
    for completion in completions:
        called = bool(completion.tool_calls)
        problem = _answer_problem(fmt, completion.text, called, completion.finish_reason)
        if problem is not None:
            return problem
    return None


def _answer_problem(fmt: ResponseFormat | None, text: str, called: bool, finish: str) -> str | None:
    """What is wrong with one answer's `text` for `fmt`; None for nothing, no format, a
    tool call (its arguments are not the answer) or an answer cut at its token limit."""
    if fmt is None or called or finish == "length":
        return None
    return output_problem(fmt, text)


_Opened = tuple[Delta | None, AsyncGenerator[Delta, None], Served]


async def _close(opened: _Opened) -> None:
    await opened[1].aclose()


@dataclass(slots=True)
class Stream:
    """A request whose parts are streaming: each part's first piece (None: it ended
    without one), the rest of its pieces, and who serves it. The wire writes the pieces
    as they come, handing each to `add`; `close` settles what they used and fills in the
    record, once, whether the stream ran to its end or not."""

    _admitted: _Admitted
    opened: list[_Opened]
    # The request it answers.
    plan: Plan
    meters: list[UsageMeter] = field(init=False)
    headers: dict[str, str] = field(init=False)
    closed: bool = False
    # The tokens past which its usage is journaled next.
    _journal_at: int = 0

    def __post_init__(self) -> None:
        self.meters = [UsageMeter() for _ in self.opened]
        self.headers = self._admitted.headers(self.served)
        self._journal_at = JOURNAL_EVERY_TOKENS

    @property
    def served(self) -> Served:
        """Who serves the first part: the model the client is told of."""
        return self.opened[0][2]

    @property
    def works(self) -> list[Work]:
        """The parts, as they were dispatched."""
        return self._admitted.works

    def pieces(self) -> AsyncGenerator[tuple[int, Delta | None], None]:
        """The pieces of every part after its first, as they arrive: (part, piece), and
        (part, None) when that part has ended."""
        return interleave([rest for _, rest, _ in self.opened])

    def add(self, delta: Delta, index: int = 0) -> None:
        """Meter a piece of part `index` as it goes out, charging the tenant's tokens as
        they build up (a long stream is charged while it runs, not only at its end), and
        journaling its usage as often (what it is recorded at if the gateway dies)."""
        self.meters[index].add(delta)
        admitted = self._admitted
        works = admitted.works
        used = (
            self.meters[0].total(works[0].first_call.prompt_estimate)
            if len(works) == 1
            else self.usage().total_tokens
        )
        reservation = admitted.decision.reservation
        if reservation is not None:
            admitted.runtime.limiter.charge(reservation, used, self._spent)
        if used >= self._journal_at:
            self._journal_at = used + JOURNAL_EVERY_TOKENS
            record, usage = admitted.record, self.usage()
            record.served_model = self.served.route.name
            record.prompt_tokens, record.completion_tokens = (
                usage.prompt_tokens, usage.completion_tokens,
            )  # fmt: skip
            record.cost_micros = self._spent()
            admitted.journal()

    def _spent(self) -> int:
        """What the stream has cost so far: each part's usage at the model serving it."""
        works = self._admitted.works
        return sum(
            self._admitted.spend(served.route.name, meter.usage(work.first_call.prompt_estimate))
            for meter, work, (_, _, served) in zip(self.meters, works, self.opened, strict=True)
        )

    def usage(self) -> Usage:
        """What every part used so far (prompt tokens estimated until reported)."""
        works = self._admitted.works
        if len(works) == 1:
            return self.meters[0].usage(works[0].first_call.prompt_estimate)
        return Usage.sum_of(
            meter.usage(work.first_call.prompt_estimate)
            for meter, work in zip(self.meters, works, strict=True)
        )

    def finish_reason(self, index: int, called: bool) -> str:
        """Why part `index` ended: as its replica said, else by its token count."""
        meter = self.meters[index]
        return meter.finish_reason or self._admitted.works[index].first_call.finish_reason(
            meter.completion_tokens, called
        )

    def check(self, index: int, text: str, called: bool, finish: str) -> None:
        """`InvalidStructuredOutput` unless part `index`'s whole text is what its
        `response_format` asks (a call's arguments and a cut answer are not checked)."""
        fmt = self._admitted.works[index].request.options.response_format
        problem = _answer_problem(fmt, text, called, finish)
        if problem is not None:
            raise InvalidStructuredOutput(self.served.route.name, problem)

    async def close(self, status: int, reason: str | None = None) -> None:
        """End the stream (its upstream requests are cancelled if still open), settle what
        it used and finish its record with `status` (and the `reason` it was refused
        for, if it was). Later calls do nothing."""
        if self.closed:
            return
        self.closed = True
        admitted = self._admitted
        try:
            for _, rest, _ in self.opened:
                await rest.aclose()
        finally:
            works = admitted.works
            admitted.settle(
                [
                    admitted.charge(served.route.name, meter.usage(work.first_call.prompt_estimate))
                    for meter, work, (_, _, served) in zip(
                        self.meters, works, self.opened, strict=True
                    )
                ]
            )
            admitted.served_by([served for _, _, served in self.opened], self.usage())
            record = admitted.record
            if record.trace is not None:
                # Its end, to the client's last byte (or its cut: the client left).
                name = "gateway.stream.end" if status < 400 else "gateway.stream.cut"
                ended: dict[str, Attribute] = {
                    "gateway.stream.status": status,
                    "gateway.stream.reason": reason or "",
                }
                record.trace.event(name, ended)
            record.finish(status, reason)


def omitted_header(types: tuple[str, ...]) -> str:
    """The `x-gateway-omitted-tools` value: the types left out, the first 16 of them."""
    shown = ", ".join(types[:MAX_OMITTED_IN_HEADER])
    more = len(types) - MAX_OMITTED_IN_HEADER
    return f"{shown}, and {more} more" if more > 0 else shown


def _most_spend(plan: Plan, prices: Mapping[str, Price]) -> int:
    """The most a request can cost, in micro-units: each part's prompt at a token per
    byte and its whole `max_tokens`, at the dearest model of its chain (a fallback may
    serve it). Its budgets are reserved this much, so that they are never spent past
    their amount by requests in flight."""
    return sum(
        max(_most_spend_at(part, part_plan.call, prices.get(r.name)) for r in part_plan.chain)
        for part, part_plan in zip(plan.parts, plan.planned, strict=True)
    )


def _most_spend_at(part: InferenceRequest, call: UpstreamCall, price: Price | None) -> int:
    """The most `part` can cost at `price` (0: no price): its prompt at a token per byte
    (the template the gateway rendered, or the messages a server will render), and its
    whole `max_tokens`."""
    if price is None:
        return 0
    prompt = most_tokens(call.prompt) if call.prompt else most_request_tokens(part)
    return price.cost_micros(prompt, 0, part.params.max_tokens)


def _check_model_kind(route: ModelRoute, inference: InferenceRequest) -> None:
    """An embedding request needs an embedding model, and any other request another
    model; an embedding request's inputs and `dimensions` must suit the model."""
    embeddings = route.config.capabilities.embeddings
    if (inference.kind is RequestKind.EMBEDDING) != (embeddings is not None):
        raise WrongModelKind(route.name, embedding=embeddings is not None)
    if embeddings is None:
        return
    if len(inference.inputs) > embeddings.max_inputs:
        raise InvalidRequest(
            f"`input` may hold at most {embeddings.max_inputs} texts for `{route.name}`.",
            "input",
        )
    for index, text in enumerate(inference.inputs):
        tokens = estimate_tokens(text)
        if tokens > embeddings.max_input_tokens:
            where = f"input[{index}]" if len(inference.inputs) > 1 else "input"
            raise InvalidRequest(
                f"`{where}` is about {tokens} tokens; `{route.name}` takes at most "
                f"{embeddings.max_input_tokens} tokens a text.",
                where,
            )
    dimensions = inference.dimensions
    if dimensions is not None and dimensions != embeddings.dimensions:
        if not embeddings.shortenable:
            raise MissingCapability(route.name, "dimensions")
        if dimensions > embeddings.dimensions:
            raise InvalidRequest(
                f"`dimensions` may be at most {embeddings.dimensions} for `{route.name}`.",
                "dimensions",
            )


def _logged_prompt(inference: InferenceRequest) -> str:
    if inference.kind is RequestKind.EMBEDDING:
        return "\n".join(inference.inputs)
    if inference.prompts:
        return "\n".join(inference.prompts)
    return inference.prompt or "\n".join(f"{m.role}: {m.content}" for m in inference.messages)


def _deadline(route: ModelRoute, asked: str | None) -> float:
    """When the request must be answered: `x-request-timeout` seconds from now, capped by
    the model's `timeouts.total_s`."""
    limit = route.config.timeouts.total_s
    if asked is not None:
        try:
            seconds = float(asked)
        except ValueError:
            seconds = -1.0
        if not 0 < seconds < float("inf"):
            raise InvalidRequest(
                "`x-request-timeout` must be a positive number of seconds.", "x-request-timeout"
            )
        limit = min(limit, seconds)
    return time.monotonic() + limit
