"""Which limits apply: the buckets one tenant (and its managed key) takes from when it
calls one model, and the parts of their Lua calls that are the same for every request.

The policy of the rate limiter (`limiter.py`), written once here: a plan is built per
(tenant, model, key) and kept; `RateLimiter` only fills in each request's amounts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gateway.config import Budget, RateLimits, Tenant
from gateway.config.schema import ToolRate
from gateway.ratelimit.buckets import DAY_BUDGET, MONTH_BUDGET, BucketSpec, bucket_key
from gateway.ratelimit.coalescer import PackedCall
from gateway.ratelimit.headers import HEADER_NAMES
from gateway.ratelimit.key_quota import KeyQuota
from gateway.ratelimit.redis_store import adjust_call

Kind = Literal["requests", "tokens", "spend"]

# An MCP tool call is limited as a call of the "model" `mcp:{server}/{tool}`: the tenant's
# and its key's request buckets, and the tool's own rate (tenants.yaml `mcp.limits`).
MCP_TOOL_PREFIX = "mcp:"

# A budget's period as take.lua knows it: its refill rate.
_PERIOD_RATES = {"day": DAY_BUDGET, "month": MONTH_BUDGET, "total": 0.0}


@dataclass(frozen=True, slots=True)
class Bucket:
    """One configured bucket: a rate per minute and a burst size; or a spend budget
    (kind `spend`): `per_minute` and `capacity` are its amount in micro-units, whole
    again at the start of each period (`period_rate`, as take.lua knows it)."""

    kind: Kind
    key: str
    per_minute: int
    capacity: float
    period_rate: float | None = None
    # A budget's soft threshold (a share of it), and who and what it caps, for metrics:
    # (tenant, key id or "", period, model or "").
    soft: float = 1.0
    scope: tuple[str, str, str, str] = ("", "", "", "")
    # A managed key's own bucket (its `limits`), not its tenant's.
    of_key: bool = False

    @property
    def refill_per_ms(self) -> float:
        if self.period_rate is not None:
            return self.period_rate
        return self.per_minute / 60_000

    def spec(self, cost: float, share: int = 1) -> BucketSpec:
        """The bucket for the store; `share` divides it among gateway replicas."""
        if self.period_rate is not None:  # a period is no rate: it is not divided
            return BucketSpec(self.key, self.capacity / share, self.period_rate, cost)
        return BucketSpec(self.key, self.capacity / share, self.refill_per_ms / share, cost)


@dataclass(frozen=True, slots=True)
class PackedCalls:
    """A plan's calls packed once (where the store packs calls), for leases of `ttl_ms`:
    a take, with a lease, a charge or refund of its token buckets, and one that also
    releases the lease (None without token buckets)."""

    take: PackedCall
    take_lease: PackedCall | None
    adjust: PackedCall | None
    adjust_release: PackedCall | None
    ttl_ms: int


@dataclass(frozen=True, slots=True)
class LimitPlan:
    """Every limit that applies to one tenant calling one model, and the parts of its
    take.lua call that are the same for every request (built once, not per request)."""

    buckets: tuple[Bucket, ...]
    max_concurrent: int | None
    inflight_key: str
    shadow: bool
    token_buckets: tuple[Bucket, ...] = ()
    # KEYS without and with the lease key.
    keys: tuple[str, ...] = ()
    lease_keys: tuple[str, ...] = ()
    # ARGV up to the lease's part: each request bucket's cost is 1 already; a request's
    # reserved tokens go at `token_cost_at`.
    args: tuple[Any, ...] = ()
    token_cost_at: tuple[int, ...] = ()
    # The same for adjust.lua's charges and refunds of the token buckets: KEYS without
    # and with the lease key, ARGV up to the lease's part (no lease operation, each
    # change 0: a request's goes at `token_change_at`).
    adjust_keys: tuple[str, ...] = ()
    adjust_lease_keys: tuple[str, ...] = ()
    adjust_args: tuple[Any, ...] = ()
    token_change_at: tuple[int, ...] = ()
    # With at most one bucket of each kind (the usual plan), each one's headers: their
    # names, the limit's text, and where its remaining level is in take.lua's reply.
    header_slots: tuple[tuple[str, str, str, str, int], ...] | None = None
    # Its calls packed once, where the store packs calls (`RateLimiter._plan` adds them).
    packers: PackedCalls | None = None
    # Spend budgets: the buckets (after every rate bucket), where a request's reserved
    # spend goes in take.lua's ARGV and its change in adjust.lua's, and each budget's
    # place in take.lua's reply.
    spend_buckets: tuple[Bucket, ...] = ()
    spend_cost_at: tuple[int, ...] = ()
    spend_change_at: tuple[int, ...] = ()
    spend_slots: tuple[tuple[Bucket, int], ...] = ()
    # The key's own caps it was made with.
    key: KeyQuota | None = None

    @property
    def unlimited(self) -> bool:
        return not self.buckets and self.max_concurrent is None

    @property
    def key_id(self) -> str:
        """The managed key whose caps it holds ("" for none)."""
        return "" if self.key is None else self.key.key_id

    def costs(self, reserve_tokens: int, reserve_micros: int = 0) -> list[int]:
        """What a request takes from each bucket, in the order of `buckets`."""
        return [
            1 if b.kind == "requests" else reserve_tokens if b.kind == "tokens" else reserve_micros
            for b in self.buckets
        ]


def _buckets(
    prefix: str, tenant: str, model: str | None, limits: RateLimits | ToolRate
) -> list[Bucket]:
    found = []
    for kind, per_minute, burst in (
        ("requests", limits.requests_per_minute, limits.burst_requests),
        ("tokens", limits.tokens_per_minute, limits.burst_tokens),
    ):
        if per_minute is not None:
            key = bucket_key(prefix, tenant, kind, model)
            found.append(Bucket(kind, key, per_minute, float(burst or per_minute)))  # type: ignore[arg-type]
    return found


def _budget_buckets(
    prefix: str,
    tenant: str,
    model: str,
    budgets: Sequence[Budget],
    key_id: str = "",
    *,
    model_only: bool = False,
) -> list[Bucket]:
    """The spend buckets of `budgets` (the tenant's, or one key's) that cap `model` (with
    `model_only`, those that name it: not the ones that cap every model)."""
    found = []
    for budget in budgets:
        if budget.model != model and (model_only or budget.model is not None):
            continue
        owner = f"spend:key:{key_id}" if key_id else "spend"
        key = bucket_key(prefix, tenant, f"{owner}:{budget.period}", budget.model)
        micros = budget.amount_micros
        scope = (tenant, key_id, budget.period, budget.model or "")
        period_rate = _PERIOD_RATES[budget.period]
        found.append(Bucket("spend", key, micros, float(micros), period_rate, budget.soft, scope))
    return found


def _key_buckets(prefix: str, tenant: str, key: KeyQuota) -> list[Bucket]:
    """A managed key's own rate buckets (`{prefix}:{tenant}:key:<id>:requests`, ...),
    their burst their rate per minute."""
    found = []
    for kind, per_minute in (
        ("requests", key.requests_per_minute),
        ("tokens", key.tokens_per_minute),
    ):
        if per_minute is not None:
            bucket = bucket_key(prefix, tenant, f"key:{key.key_id}:{kind}")
            found.append(Bucket(kind, bucket, per_minute, float(per_minute), of_key=True))  # type: ignore[arg-type]
    return found


def plan_for(
    prefix: str,
    name: str,
    tenant: Tenant,
    model: str,
    key: KeyQuota | None = None,
    *,
    model_only: bool = False,
) -> LimitPlan:
    """The buckets and lease of `tenant` calling `model`, with the spend budgets of the
    tenant, and the caps of its managed key (`key`): its rates and its budgets.

    `model_only`: only what caps `model` itself (the tenant's limits for it, the budgets
    of the tenant and the key that name it), no lease: what a fallback to `model` takes
    on top of the request's own admission, which took the rest."""
    buckets = [] if model_only else _buckets(prefix, name, None, tenant.limits)
    model_limits: RateLimits | ToolRate | None = tenant.limits.models.get(model)
    if model_limits is None and model.startswith(MCP_TOOL_PREFIX):
        model_limits = tenant.mcp.limits.get(model[len(MCP_TOOL_PREFIX) :])
    if model_limits is not None:
        buckets += _buckets(prefix, name, model, model_limits)
    spend = _budget_buckets(prefix, name, model, tenant.budgets, model_only=model_only)
    if key is not None:
        if not model_only:
            buckets += _key_buckets(prefix, name, key)
        spend += _budget_buckets(
            prefix, name, model, key.budgets, key.key_id, model_only=model_only
        )
    buckets += spend
    inflight_key = bucket_key(prefix, name, "inflight", None)
    # The store's arguments, as `RedisBuckets.take` would build them from each bucket's
    # `spec` (which checks the limits here once, as it did on every take).
    specs = [b.spec(1 if b.kind == "requests" else 0) for b in buckets]
    rated = [b for b in buckets if b.kind != "spend"]
    keys = tuple(spec.key for spec in specs)
    args: list[Any] = [len(keys)]
    for spec in specs:
        args += (spec.capacity, spec.refill_per_ms, spec.cost)
    # And as `RedisBuckets.adjust_soon` builds them.
    token_buckets = tuple(b for b in buckets if b.kind == "tokens")
    adjusted = [*token_buckets, *spend]
    adjust_keys, adjust_args = adjust_call([b.spec(0) for b in adjusted], None, None)
    changes_at = [4 + 3 * i for i in range(len(adjusted))]
    return LimitPlan(
        buckets=tuple(buckets),
        max_concurrent=None if model_only else tenant.limits.max_concurrent,
        inflight_key=inflight_key,
        shadow=tenant.shadow,
        token_buckets=token_buckets,
        keys=keys,
        lease_keys=(*keys, inflight_key),
        args=encoded(args),
        token_cost_at=tuple(3 + 3 * i for i, b in enumerate(buckets) if b.kind == "tokens"),
        adjust_keys=tuple(adjust_keys),
        adjust_lease_keys=(*adjust_keys, inflight_key),
        adjust_args=encoded(adjust_args),
        token_change_at=tuple(changes_at[: len(token_buckets)]),
        header_slots=header_slots(rated),
        spend_buckets=tuple(spend),
        spend_cost_at=tuple(3 + 3 * i for i, b in enumerate(buckets) if b.kind == "spend"),
        spend_change_at=tuple(changes_at[len(token_buckets) :]),
        spend_slots=tuple((b, 3 + 4 * (len(rated) + i)) for i, b in enumerate(spend)),
        key=key,
    )


def encoded(args: Sequence[Any]) -> tuple[Any, ...]:
    """`args` with each float as the bytes it is sent as: hiredis and redis-py both send a
    float as its repr, and bytes as they are. The same command, packed at a fraction of
    the cost (a float's repr was most of what packing a call cost)."""
    return tuple(repr(a).encode() if type(a) is float else a for a in args)


def header_slots(buckets: Sequence[Bucket]) -> tuple[tuple[str, str, str, str, int], ...] | None:
    kinds = [b.kind for b in buckets]
    if len(set(kinds)) < len(kinds):
        return None  # the tightest bucket of a kind is found per request
    slots = []
    for i, bucket in enumerate(buckets):
        limit, left, reset = HEADER_NAMES[bucket.kind]
        slots.append((limit, str(bucket.per_minute), left, reset, 3 + 4 * i))
    return tuple(slots)
