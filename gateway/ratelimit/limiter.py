"""The rate limiter: a request's reservation taken, charged and settled in the store, and
what to do without Redis. Which buckets apply is `limit_plan.py`'s; what the answer says,
`decisions.py`'s; the Redis calls, `redis_store.py`'s.

One Redis call admits a request: it takes one request from each request bucket, the
reserved tokens from each token bucket, and a concurrency lease, all or nothing.
Tokens are charged further while a response streams and settled to the actual usage
at the end, off the request's critical path. A lease lives `LEASE_TTL_S` unless renewed:
the limiter renews the leases of running requests every `LEASE_RENEW_S`, so a request may
run for as long as it needs while a gateway that dies frees its slots within `LEASE_TTL_S`.

Without Redis, `outage.py` decides (in `local` mode, in-process buckets whose takes are
owed to Redis and charged to it before it admits again).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.config import (
    RateLimitConfig,
    TenantsConfig,
)
from gateway.inference.ids import unique_id
from gateway.observability import metrics
from gateway.ratelimit.buckets import (
    BucketSpec,
    LeaseSpec,
    monotonic_ms,
)
from gateway.ratelimit.decisions import Decision, Reservation, allowed_headers, decide
from gateway.ratelimit.errors import UnknownTenant
from gateway.ratelimit.key_quota import KeyQuota
from gateway.ratelimit.limit_plan import LimitPlan, PackedCalls, plan_for
from gateway.ratelimit.outage import RedisOutage
from gateway.ratelimit.redis_store import (
    NO_LEASE,
    RELEASE,
    RedisBuckets,
    take_result,
)
from gateway.storage.redis_client import REDIS_ERRORS

log = logging.getLogger("gateway.ratelimit")

# A concurrency slot outlives a gateway that died by at most this long.
LEASE_TTL_S = 30.0
# How often the leases of running requests are renewed (a third of their life, so one
# lost renewal does not cost a slot).
LEASE_RENEW_S = 10.0
# How long after its request's deadline a lease is still renewed: a stream cut at its
# deadline settles once its last events have reached the client, which may take up to
# `server.stream_stall_timeout_s` (30 s by default).
LEASE_AFTER_DEADLINE_S = 60.0
# Plans kept (tenants x models x keys with caps of their own), past which they are made
# again.
MAX_PLANS = 65_536


class RateLimiter:
    """Admits, charges and settles requests against per-tenant buckets in Redis."""

    def __init__(
        self,
        store: RedisBuckets,
        ping: Any,
        tenants: TenantsConfig,
        config: RateLimitConfig,
        key_prefix: str,
    ) -> None:
        self._store = store
        self._config = config
        self._prefix = key_prefix
        # Redis down: the local buckets, what they owe, the settles held (`outage.py`).
        self._outage = RedisOutage(store, ping, config, self._send_adjust)
        # By (tenant, model, key id, model only): the key's own budgets are in its plan
        # (a key without budgets shares its tenant's plan, under key id "").
        self._plans: dict[tuple[str, str, str, bool], LimitPlan] = {}
        self._tenants = tenants.tenants
        # Charges and settles sent to Redis and not answered yet, with the lease each
        # one releases (if any).
        self._adjusting: dict[asyncio.Future[Any], LeaseSpec | None] = {}
        # The reservations of running requests that hold a lease, by lease member.
        self._leased: dict[str, Reservation] = {}
        self._renewer: asyncio.Task[None] | None = None
        metrics.RATELIMIT_BACKEND_UP.set(1)

    @property
    def redis_up(self) -> bool:
        """False while Redis is unreachable and the fallback mode decides."""
        return not self._outage.down

    def update_tenants(self, tenants: TenantsConfig) -> None:
        """Apply reloaded limits; bucket levels in Redis carry over."""
        self._tenants = tenants.tenants
        # The levels Redis reported under the old limits, as they would have been seeded.
        self._outage.seed()
        self._plans.clear()

    def _plan(
        self, tenant: str, model: str, key: KeyQuota | None = None, *, model_only: bool = False
    ) -> LimitPlan:
        if key is not None and key.empty:
            key = None
        key_id = "" if key is None else key.key_id
        cached = (tenant, model, key_id, model_only)
        plan = self._plans.get(cached)
        # A key's caps may be changed while it is in use (`gateway keys update`).
        if plan is None or (plan.key is not key and plan.key != key):
            config = self._tenants.get(tenant)
            if config is None:
                # A reload removed the tenant after its key was checked.
                raise UnknownTenant(tenant)
            plan = plan_for(self._prefix, tenant, config, model, key, model_only=model_only)
            packers = self._packers(plan)
            if packers is not None:
                plan = dataclasses.replace(plan, packers=packers)
            if len(self._plans) >= MAX_PLANS:
                self._plans.clear()  # keys come and go: plans are cheap to make again
            self._plans[cached] = plan
        return plan

    def _packers(self, plan: LimitPlan) -> PackedCalls | None:
        """The plan's calls packed once, with placeholders (0, "") where a request's
        amount and lease member go; None where the store does not pack calls."""
        packer = self._store.packer
        take = packer("take", plan.keys, plan.args, plan.token_cost_at, None, plan.spend_cost_at)
        if take is None:
            return None
        ttl_ms = int(LEASE_TTL_S * 1000)
        take_lease = None
        if plan.max_concurrent is not None:
            lease_args = (*plan.args, "", plan.max_concurrent, ttl_ms)
            take_lease = packer(
                "take",
                plan.lease_keys,
                lease_args,
                plan.token_cost_at,
                len(plan.args),
                plan.spend_cost_at,
            )
        adjust = adjust_release = None
        if plan.token_buckets or plan.spend_buckets:
            adjust = packer(
                "adjust",
                plan.adjust_keys,
                plan.adjust_args,
                plan.token_change_at,
                None,
                plan.spend_change_at,
            )
            if plan.max_concurrent is not None:
                release_args = list(plan.adjust_args)
                release_args[1] = RELEASE
                release_args += ("", ttl_ms)
                adjust_release = packer(
                    "adjust",
                    plan.adjust_lease_keys,
                    release_args,
                    plan.token_change_at,
                    len(plan.adjust_args),
                    plan.spend_change_at,
                )
        return PackedCalls(take, take_lease, adjust, adjust_release, ttl_ms)

    async def admit(
        self,
        tenant: str,
        model: str,
        reserve_tokens: int,
        deadline: float = math.inf,
        *,
        holds_slot: bool = True,
        reserve_micros: int = 0,
        key: KeyQuota | None = None,
        model_only: bool = False,
    ) -> Decision:
        """Take what one request needs from every bucket that applies, or refuse.

        `deadline` (time.monotonic()) is when the request ends at the latest; its lease
        is renewed until then. A request that asks for no inference (`holds_slot` false)
        takes no concurrency slot: it counts against the request limit only. Its most
        possible spend (`reserve_micros`) is taken from the tenant's budgets and those of
        its managed key (`key`), as one request and its tokens are from the key's own
        rates, on the same call. `model_only`: only `model`'s own limits and budgets
        (`plan_for`), for a request admitted for another model that falls back to it.
        """
        plan = self._plan(tenant, model, key, model_only=model_only)
        if plan.unlimited:
            return Decision(allowed=True)
        lease = None
        if plan.max_concurrent is not None and holds_slot:
            lease = LeaseSpec(
                plan.inflight_key, unique_id(), plan.max_concurrent, int(LEASE_TTL_S * 1000)
            )
        reply = None
        outage = self._outage
        if not outage.down:
            try:
                reply = await self._take_in_redis(plan, reserve_tokens, lease, reserve_micros)
            except REDIS_ERRORS as exc:
                metrics.REDIS_ERRORS.labels("take").inc()
                outage.mark_down(exc)
            else:
                outage.report((tenant, model, plan.key_id, model_only), plan.buckets, reply)
        local = reply is None
        if reply is not None and reply[0] == 1:
            # Allowed by Redis, as nearly every request is: the headers straight from the
            # reply, as `decide` would make them from its `TakeResult`.
            decision = Decision(allowed=True, headers=allowed_headers(plan, reply))
        else:
            if local:
                costs = plan.costs(reserve_tokens, reserve_micros)
                result = outage.take(plan.buckets, costs, lease, plan.shadow)
                if result is None:  # `open` mode without Redis
                    return Decision(allowed=True)
            else:
                result = take_result(reply, len(plan.buckets), lease is not None)
            decision = decide(plan, result)
            if local and decision.never_fits:
                # The local buckets hold a share of the limit; the whole one may fit.
                fits = all(cost <= b.capacity for b, cost in zip(plan.buckets, costs, strict=True))
                if fits:
                    decision.never_fits = False
                    decision.retry_after_s = self._config.redis_retry_s
        if decision.allowed:
            decision.reservation = Reservation(
                plan.token_buckets,
                lease,
                reserve_tokens,
                local,
                deadline,
                outage=outage.outages if local else 0,
                plan=plan,
                spend_buckets=plan.spend_buckets,
                charged_micros=reserve_micros,
            )
            if lease is not None:
                self._hold_lease(decision.reservation, lease)
            metrics.labels(metrics.RATELIMIT_DECISIONS, tenant, "allowed").inc()
        elif plan.shadow:
            log.info("shadow: tenant %s would be refused by %s", tenant, decision.refused_by)
            metrics.RATELIMIT_DECISIONS.labels(tenant, "shadow_refused").inc()
            return Decision(allowed=True, headers=decision.headers)
        else:
            metrics.RATELIMIT_DECISIONS.labels(tenant, f"refused_{decision.refused_by}").inc()
        return decision

    def _take_in_redis(
        self, plan: LimitPlan, reserve_tokens: int, lease: LeaseSpec | None, reserve_micros: int = 0
    ) -> Awaitable[Any]:
        """take.lua's reply for one request: what `RedisBuckets.take` sends for the
        plan's buckets at their costs, built from the plan's parts."""
        for cost, at in (
            (reserve_tokens, plan.token_cost_at),
            (reserve_micros, plan.spend_cost_at),
        ):
            if cost < 0 and at:
                # As `check_costs` refuses it: a negative take would add to the bucket.
                key = plan.keys[(at[0] - 3) // 3]
                raise ValueError(f"bucket {key}: a take's cost must be >= 0, not {cost}")
        packers = plan.packers
        if packers is not None:
            if lease is None:
                packed = packers.take.pack(reserve_tokens, None, reserve_micros)
                return self._store.take_reply(plan.keys, (), packed)
            if packers.take_lease is not None and lease.ttl_ms == packers.ttl_ms:
                packed = packers.take_lease.pack(reserve_tokens, lease.member, reserve_micros)
                return self._store.take_reply(plan.lease_keys, (), packed)
        args = list(plan.args)
        for i in plan.token_cost_at:
            args[i] = reserve_tokens
        for i in plan.spend_cost_at:
            args[i] = reserve_micros
        if lease is None:
            return self._store.take_reply(plan.keys, args)
        args += (lease.member, lease.limit, lease.ttl_ms)
        return self._store.take_reply(plan.lease_keys, args)

    def charge(
        self, reservation: Reservation, used_tokens: int, spent: Callable[[], int] | None = None
    ) -> None:
        """Charge tokens used beyond what was taken, once a batch has built up, and what
        they cost beyond the reserved spend (`spent()`: asked only then)."""
        if used_tokens - reservation.charged >= self._config.charge_batch_tokens:
            delta = used_tokens - reservation.charged
            reservation.charged = used_tokens
            spend_delta = 0
            if spent is not None and reservation.spend_buckets:
                micros = spent()
                if micros > reservation.charged_micros:  # a stream's spend only grows
                    spend_delta = micros - reservation.charged_micros
                    reservation.charged_micros = micros
            self._adjust(reservation, delta, release=False, spend_delta=spend_delta)

    def settle(self, reservation: Reservation, used_tokens: int, spent_micros: int = 0) -> None:
        """Bring the charge to the actual usage and spend (refunding the unused
        reservation) and release the concurrency lease, in the background."""
        delta = used_tokens - reservation.charged
        reservation.charged = used_tokens
        spend_delta = spent_micros - reservation.charged_micros
        reservation.charged_micros = spent_micros
        self._adjust(reservation, delta, release=True, spend_delta=spend_delta)

    def give_back(
        self,
        taken_with: Reservation,
        tenant: str,
        model: str,
        key: KeyQuota | None,
        tokens: int,
        micros: int,
    ) -> None:
        """Give `tokens` and `micros` back to `model`'s own limits and budgets (not the
        tenant's or the key's, which keep them): what a request admitted for `model`
        (`taken_with`) used on a fallback, charged there instead."""
        try:
            plan = self._plan(tenant, model, key, model_only=True)
        except UnknownTenant:
            return  # reloaded away: its buckets are no longer anyone's
        if plan.unlimited or (tokens <= 0 and micros <= 0):
            return
        moved = Reservation(
            plan.token_buckets,
            None,
            tokens,
            taken_with.local,
            outage=taken_with.outage,
            plan=plan,
            spend_buckets=plan.spend_buckets,
            charged_micros=micros,
        )
        self.settle(moved, 0, 0)

    def _adjust(
        self, reservation: Reservation, delta: int, release: bool, spend_delta: int = 0
    ) -> None:
        lease = reservation.lease if release else None
        if lease is not None:
            self._leased.pop(lease.member, None)
        if not reservation.spend_buckets:
            spend_delta = 0
        outage = self._outage
        if reservation.local and reservation.outage > outage.outages_charged:
            # Redis has not been charged for this outage yet: the change goes to the local
            # buckets, and so into what Redis will be charged.
            share = self._config.gateway_replicas
            specs = _changes(reservation, delta, spend_delta, share)
            if specs or lease is not None:
                outage.local.adjust(specs, lease, monotonic_ms())
            return
        if reservation.local:
            # Taken locally in an outage Redis has been charged for, take included: the
            # rest of its tokens are Redis's too (once, as a request admitted there), and
            # its lease was never in Redis.
            if lease is not None:
                outage.local.adjust(None, lease, monotonic_ms())
            lease = None
        elif not outage.down and reservation.plan is not None:
            self._send_planned_adjust(reservation.plan, delta, lease, spend_delta)
            return
        specs = _changes(reservation, delta, spend_delta)
        if not specs and lease is None:
            return
        if outage.down:
            outage.hold(specs, lease)
        else:
            self._send_adjust(specs, lease)

    def _send_planned_adjust(
        self, plan: LimitPlan, delta: int, release: LeaseSpec | None, spend_delta: int = 0
    ) -> None:
        """`_send_adjust` of the plan's token buckets changed by `delta` and its budgets by
        `spend_delta`, with the call's KEYS and ARGV built from the plan's parts (nothing
        sent if there is nothing to change or release)."""
        packers = plan.packers
        if (delta or spend_delta) and packers is not None:
            packed = None
            if release is None and packers.adjust is not None:
                keys, packed = plan.adjust_keys, packers.adjust.pack(delta, None, spend_delta)
            elif (
                release is not None
                and packers.adjust_release is not None
                and release.ttl_ms == packers.ttl_ms
            ):
                packed = packers.adjust_release.pack(delta, release.member, spend_delta)
                keys = plan.adjust_lease_keys
            if packed is not None:
                adjusted = self._store.adjust_reply_soon(keys, (), packed=packed)
                self._adjusting[adjusted] = release
                adjusted.add_done_callback(self._adjusted)
                return
        if (delta and plan.token_buckets) or (spend_delta and plan.spend_buckets):
            args = list(plan.adjust_args)
            for i in plan.token_change_at:
                args[i] = delta
            for i in plan.spend_change_at:
                args[i] = spend_delta
            keys = plan.adjust_keys
        elif release is None:
            return
        else:
            args, keys = [0, NO_LEASE], ()
        if release is not None:
            args[1] = RELEASE
            keys = plan.adjust_lease_keys if keys else (release.key,)
            args += (release.member, release.ttl_ms)
        adjusted = self._store.adjust_reply_soon(keys, args)
        self._adjusting[adjusted] = release
        adjusted.add_done_callback(self._adjusted)

    def _send_adjust(
        self, specs: list[BucketSpec], release: LeaseSpec | None, renew: LeaseSpec | None = None
    ) -> None:
        # Off the critical path: sent with the other calls of this moment.
        adjusted = self._store.adjust_soon(specs, release, renew)
        self._adjusting[adjusted] = release
        adjusted.add_done_callback(self._adjusted)

    def _adjusted(self, adjusted: asyncio.Future[Any]) -> None:
        lease = self._adjusting.pop(adjusted, None)
        if adjusted.cancelled():
            return
        exc = adjusted.exception()
        if isinstance(exc, REDIS_ERRORS):
            metrics.REDIS_ERRORS.labels("adjust").inc()
            if lease is not None:
                # Whether the charge was applied is unknown, so it is not sent twice;
                # releasing a lease is safe to repeat.
                self._outage.hold([], lease)
            self._outage.mark_down(exc)
        elif exc is not None:
            log.error("settling a rate-limit charge failed", exc_info=exc)

    def _hold_lease(self, reservation: Reservation, lease: LeaseSpec) -> None:
        self._leased[lease.member] = reservation
        if self._renewer is None:
            self._renewer = asyncio.create_task(self._renew_leases())

    async def _renew_leases(self) -> None:
        """Keep the leases of running requests alive, all of them every LEASE_RENEW_S."""
        while True:
            await asyncio.sleep(LEASE_RENEW_S)
            now = time.monotonic()
            for member, reservation in list(self._leased.items()):
                lease = reservation.lease
                assert lease is not None
                if now > reservation.deadline + LEASE_AFTER_DEADLINE_S:
                    # Long past its request's deadline and never settled: let it expire.
                    del self._leased[member]
                    log.warning("a concurrency lease was never released; it expires now")
                elif reservation.local:
                    self._outage.local.adjust(None, None, monotonic_ms(), renew=lease)
                elif not self._outage.down:
                    self._send_adjust([], None, renew=lease)

    async def close(self) -> None:
        """Finish pending settles (briefly) and stop probing."""
        if self._renewer is not None:
            self._renewer.cancel()
        if self._adjusting:
            await asyncio.wait(list(self._adjusting), timeout=2.0)
        await self._store.close()
        self._outage.close()


def _changes(
    reservation: Reservation, delta: int, spend_delta: int, share: int = 1
) -> list[BucketSpec]:
    """The charges (or refunds) of a reservation's token buckets by `delta` and its
    budgets by `spend_delta`, each bucket divided by `share`."""
    specs = [b.spec(delta, share) for b in reservation.token_buckets] if delta else []
    if spend_delta:
        specs += [b.spec(spend_delta, share) for b in reservation.spend_buckets]
    return specs
