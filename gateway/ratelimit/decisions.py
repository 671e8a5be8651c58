"""What the limiter answers: a request allowed or refused, why, how long to wait, and the
headers its answer carries (`x-ratelimit-*`, `x-budget-*`), made from take.lua's reply."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.observability import metrics
from gateway.ratelimit.buckets import BucketResult, LeaseSpec, TakeResult
from gateway.ratelimit.headers import HEADER_NAMES, MS_TEXT, bucket_headers, duration
from gateway.ratelimit.limit_plan import Bucket, Kind, LimitPlan


@dataclass(slots=True)
class Reservation:
    """What an admitted request took, so it can be charged and settled later."""

    token_buckets: tuple[Bucket, ...]
    lease: LeaseSpec | None
    # Tokens taken so far (the reservation, then each charge).
    charged: int
    # Taken from the in-process buckets (Redis was down) rather than from Redis.
    local: bool
    # The request's deadline (time.monotonic()): its lease is not renewed after it, so a
    # request that is never settled (a bug) cannot hold its slot for good.
    deadline: float = math.inf
    # Taken locally: the number of the outage it was taken in (0: taken from Redis).
    outage: int = 0
    # The plan it was admitted under (its adjust.lua call's parts).
    plan: LimitPlan | None = None
    # Its spend budgets, and the micro-units taken from them so far.
    spend_buckets: tuple[Bucket, ...] = ()
    charged_micros: int = 0


@dataclass(slots=True)
class Decision:
    """The answer to one request: allowed or not, why, and the headers to send."""

    allowed: bool
    headers: dict[str, str] = field(default_factory=dict)
    refused_by: Literal["requests", "tokens", "spend", "concurrency"] | None = None
    retry_after_s: float | None = None
    # The request is larger than a bucket can ever hold: waiting will not help.
    never_fits: bool = False
    # The limit that refused: per minute (requests, tokens), at once (concurrency), or a
    # budget in micro-units (spend).
    limit: int | None = None
    # The budget that refused (spend): its period.
    period: str | None = None
    # The limit that refused is the API key's own (its `limits`), not its tenant's.
    of_key: bool = False
    reservation: Reservation | None = None


def allowed_headers(plan: LimitPlan, reply: Any) -> dict[str, str]:
    """The headers `decide` makes, from take.lua's reply itself: for each kind, the
    bucket with the smallest share of its capacity left (the first of equals)."""
    headers: dict[str, str] = {}
    if plan.spend_slots:
        budget_headers(headers, [(b, float(reply[i]), reply[i + 2]) for b, i in plan.spend_slots])
    if plan.header_slots is not None:
        for limit, limit_text, left, reset, i in plan.header_slots:
            headers[limit] = limit_text
            headers[left] = str(max(0, int(float(reply[i]))))
            reset_ms = reply[i + 2]
            # Most waits are under a second: their text is `duration`'s, made once.
            if type(reset_ms) is int and 0 <= reset_ms < 1000:
                headers[reset] = MS_TEXT[reset_ms]
            else:
                headers[reset] = duration(reset_ms)
        return headers
    tightest: dict[str, tuple[Bucket, float, int]] = {}
    i = 3
    for bucket in plan.buckets:
        if bucket.kind == "spend":
            break  # after every rate bucket, done above
        remaining = float(reply[i])
        best = tightest.get(bucket.kind)
        if best is None or remaining / bucket.capacity < best[1] / best[0].capacity:
            tightest[bucket.kind] = (bucket, remaining, reply[i + 2])
        i += 4
    for bucket, remaining, reset_ms in tightest.values():
        limit, left, reset = HEADER_NAMES[bucket.kind]
        headers[limit] = str(bucket.per_minute)
        headers[left] = str(max(0, int(remaining)))
        headers[reset] = duration(reset_ms)
    return headers


def budget_headers(headers: dict[str, str], budgets: Sequence[tuple[Bucket, float, int]]) -> None:
    """The `x-budget-*` headers of the budget with the smallest share left (amounts in
    the price table's currency), and each budget's use into the metrics."""
    tightest = None
    for bucket, remaining, reset_ms in budgets:
        metrics.budget_used(bucket.scope, bucket.capacity, remaining, bucket.soft)
        if tightest is None or remaining / bucket.capacity < tightest[1] / tightest[0].capacity:
            tightest = (bucket, remaining, reset_ms)
    if tightest is None:
        return
    bucket, remaining, reset_ms = tightest
    headers["x-budget-limit"] = amount_text(bucket.per_minute)
    headers["x-budget-remaining"] = amount_text(max(0, math.floor(remaining)))
    headers["x-budget-period"] = bucket.scope[2]
    if reset_ms >= 0 and bucket.period_rate:
        headers["x-budget-reset"] = duration(reset_ms)


def _ends(retry_after_ms: int) -> float:
    """A budget's wait as a number to compare (never: the longest)."""
    return math.inf if retry_after_ms < 0 else retry_after_ms


def amount_text(micros: int) -> str:
    """Micro-units as an amount of the currency: `1.5`, `0.000001`, `12`."""
    whole, part = divmod(micros, 1_000_000)
    return f"{whole}.{part:06d}".rstrip("0").rstrip(".") if part else str(whole)


def decide(plan: LimitPlan, result: TakeResult) -> Decision:
    headers: dict[str, str] = {}
    tightest: dict[str, tuple[Bucket, BucketResult]] = {}
    budgets = [
        (bucket, outcome.remaining, outcome.reset_ms)
        for bucket, outcome in zip(plan.buckets, result.buckets, strict=True)
        if bucket.kind == "spend"
    ]
    budget_headers(headers, budgets)
    for bucket, outcome in zip(plan.buckets, result.buckets, strict=True):
        if bucket.kind == "spend":
            continue
        best = tightest.get(bucket.kind)
        if (
            best is None
            or outcome.remaining / bucket.capacity < best[1].remaining / best[0].capacity
        ):
            tightest[bucket.kind] = (bucket, outcome)
    for kind, (bucket, outcome) in tightest.items():
        headers.update(bucket_headers(kind, bucket.per_minute, outcome.remaining, outcome.reset_ms))
    if result.allowed:
        return Decision(allowed=True, headers=headers)
    refusing = [
        (bucket, outcome)
        for bucket, outcome in zip(plan.buckets, result.buckets, strict=True)
        if not outcome.allowed
    ]
    if not refusing:
        # Every bucket had room: the concurrency lease was full.
        return Decision(
            allowed=False,
            headers=headers,
            refused_by="concurrency",
            retry_after_s=1.0,
            limit=plan.max_concurrent,
        )
    over_budget = [(b, o) for b, o in refusing if b.kind == "spend"]
    if over_budget:
        # Waiting for the rate limits would not help: the budget that ends last names it.
        ends_ms = [o.retry_after_ms for _, o in over_budget]
        never = any(ms < 0 for ms in ends_ms)
        named_budget = max(
            over_budget, key=lambda r: math.inf if r[1].retry_after_ms < 0 else r[1].retry_after_ms
        )[0]
        return Decision(
            allowed=False,
            headers=headers,
            refused_by="spend",
            retry_after_s=None if never else max(ends_ms) / 1000,
            never_fits=never,
            limit=named_budget.per_minute,
            period=named_budget.scope[2],
        )
    never_fits = any(outcome.retry_after_ms < 0 for _, outcome in refusing)
    wait_ms = max(outcome.retry_after_ms for _, outcome in refusing)
    refused_by: Kind = "tokens" if any(b.kind == "tokens" for b, _ in refusing) else "requests"
    # Of that kind, the bucket that makes the client wait longest names the limit.
    named, _ = max(
        ((b, o) for b, o in refusing if b.kind == refused_by), key=lambda r: r[1].retry_after_ms
    )
    return Decision(
        allowed=False,
        headers=headers,
        refused_by=refused_by,
        retry_after_s=None if never_fits else wait_ms / 1000,
        never_fits=never_fits,
        limit=named.per_minute,
        of_key=named.of_key,
    )
