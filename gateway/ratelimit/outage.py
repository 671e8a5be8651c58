"""The rate limiter without Redis: whether Redis is down, the in-process buckets that
decide meanwhile, what they hand out (owed to Redis), the settles held until it is back,
and the probe that brings it back.

In `local` mode the local buckets start from this gateway's share of what Redis last
reported for each bucket (`report`, then `seed` when Redis goes away), so a tenant that
had used up its limit gets no fresh burst from every gateway. What they hand out is
tracked as a debt (`LocalDebts`): when Redis answers again, the debt is charged to its
buckets before it admits anything, so the refill of the outage is not handed out twice.
`open` admits without limits, `closed` refuses (`LimiterUnavailable`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from gateway.config import RateLimitConfig, RedisFailureMode
from gateway.observability import metrics
from gateway.ratelimit.buckets import (
    BucketSpec,
    LeaseSpec,
    LocalBuckets,
    LocalDebts,
    TakeResult,
    monotonic_ms,
)
from gateway.ratelimit.errors import LimiterUnavailable
from gateway.ratelimit.limit_plan import Bucket
from gateway.ratelimit.redis_store import RedisBuckets
from gateway.storage.redis_client import REDIS_ERRORS

log = logging.getLogger("gateway.ratelimit")

# Settles and lease releases kept while Redis is unreachable, sent when it is back.
MAX_UNSENT_SETTLES = 10_000
# Round trips of local debt waited for before Redis admits again. Local admissions go on
# while one is in flight and owe more, so the wait ends after a few and what is left
# goes out ahead of the first admissions instead (that order holds on a single Redis;
# on a Cluster it is a round trip's worth of local admissions).
DEBT_ROUNDS = 3

# A settle held while Redis was down: (bucket changes, lease to release).
Held = tuple[list[BucketSpec], LeaseSpec | None]


class RedisOutage:
    """What one limiter does while its Redis is unreachable, and how it comes back.

    `resend` sends a held settle once Redis answers again (the limiter's own call)."""

    def __init__(
        self,
        store: RedisBuckets,
        ping: Callable[[], Awaitable[Any]],
        config: RateLimitConfig,
        resend: Callable[[list[BucketSpec], LeaseSpec | None], None],
    ) -> None:
        self._store = store
        self._ping = ping
        self._config = config
        self._resend = resend
        self.down = False
        self.local = LocalBuckets()
        # What the local buckets handed out while Redis was unreachable, owed to Redis.
        self._debts = LocalDebts(self.local)
        # Outages so far, and the last whose local takes Redis has been charged for: a
        # local reservation of an outage up to that one is settled in Redis.
        self.outages = 0
        self.outages_charged = 0
        # Redis's latest answer for each set of buckets, with the local clock it came at:
        # what the local buckets are seeded from when Redis goes away (`seed`). Seeding
        # then rather than on every take gives the same local state at a fraction of the
        # cost, as nothing else writes bucket levels locally while Redis is up. By the
        # plan's key (the limiter's); the value: the plan's buckets, take.lua's reply,
        # the clock.
        self._reported: dict[Any, tuple[Sequence[Bucket], Any, float]] = {}
        self._unsent: deque[Held] = deque(maxlen=MAX_UNSENT_SETTLES)
        self._probe: asyncio.Task[None] | None = None

    def report(self, plan_key: Any, buckets: Sequence[Bucket], reply: Any) -> None:
        """Redis's answer for a plan's buckets, to seed the local ones from if it goes
        away (only in `local` mode, and not while it is down: a call sent before the
        outage answering late is not what the debt is measured against)."""
        if self._config.on_redis_error is RedisFailureMode.LOCAL and not self.down:
            self._reported[plan_key] = (buckets, reply, monotonic_ms())

    def hold(self, specs: list[BucketSpec], lease: LeaseSpec | None) -> None:
        """A settle (or a lease to release) that cannot reach Redis: sent when it is back
        (a lease left held would keep the tenant's slot taken until it expires, and a
        refund would be lost)."""
        self._unsent.append((specs, lease))

    def seed(self) -> None:
        """Give the local buckets this gateway's share of what each bucket held after
        Redis's last decision on it, so that without Redis they go on from there: a tenant
        that had used up its limit gets no fresh burst from every gateway when Redis goes
        away. Applied oldest first, so a key shared by several plans (the tenant's own
        buckets, under each of its models) ends at its latest level."""
        share = self._config.gateway_replicas
        reported = sorted(self._reported.values(), key=lambda entry: entry[2])
        self._reported.clear()
        for buckets, reply, now in reported:
            for i, bucket in enumerate(buckets):
                remaining = float(reply[3 + 4 * i])
                capacity, rate = bucket.capacity / share, bucket.refill_per_ms / share
                self.local.seed(bucket.key, remaining / share, capacity, rate, now)

    def take(
        self,
        buckets: Sequence[Bucket],
        costs: Sequence[int],
        lease: LeaseSpec | None,
        shadow: bool,
    ) -> TakeResult | None:
        mode = self._config.on_redis_error
        metrics.RATELIMIT_FALLBACK_DECISIONS.labels(mode.value).inc()
        # A shadow tenant's limits are never enforced, so `closed` does not refuse it.
        if mode is RedisFailureMode.OPEN or (shadow and mode is RedisFailureMode.CLOSED):
            return None
        if mode is RedisFailureMode.CLOSED:
            raise LimiterUnavailable(self._config.redis_retry_s)
        share = self._config.gateway_replicas
        specs = [b.spec(cost, share) for b, cost in zip(buckets, costs, strict=True)]
        if lease is not None:
            lease = LeaseSpec(lease.key, lease.member, math.ceil(lease.limit / share), lease.ttl_ms)
        now = monotonic_ms()
        for bucket, spec in zip(buckets, specs, strict=True):
            self._debts.track(spec, bucket.spec(0), now)
        return self.local.take(specs, lease, now)

    def mark_down(self, exc: BaseException) -> None:
        if self.down:
            return
        self.down = True
        self.outages += 1
        self.seed()
        metrics.RATELIMIT_BACKEND_UP.set(0)
        mode = self._config.on_redis_error.value
        log.warning(
            "Redis unreachable (%s: %s): rate limiting in %s mode until it is back",
            type(exc).__name__,
            exc,
            mode,
            extra={"fields": {"event": "fail_mode", "redis_up": False, "mode": mode}},
        )
        self._probe = asyncio.create_task(self._wait_for_redis())

    async def _wait_for_redis(self) -> None:
        charged = 0
        while True:
            await asyncio.sleep(self._config.redis_retry_s)
            try:
                await self._ping()
                # Still down meanwhile: local decisions go on, owing what they take.
                charged += await self._charge_debts()
            except REDIS_ERRORS:
                continue
            except Exception:
                # A bug must not keep the limiter off Redis for good.
                log.exception("charging Redis for local admissions failed")
            break
        # What local admissions took during the last round trip goes out ahead of the
        # first admissions Redis makes (queued before them, no await in between).
        charged += self._send_debts()
        self._debts.stop_tracking()
        self.outages_charged = self.outages
        self.down = False
        metrics.RATELIMIT_BACKEND_UP.set(1)
        unsent = list(self._unsent)
        self._unsent.clear()
        log.warning(
            "Redis reachable again: rate limiting in Redis (%d held settles sent, "
            "%d buckets charged for local admissions)",
            len(unsent),
            charged,
            extra={"fields": {"event": "fail_mode", "redis_up": True}},
        )
        for specs, lease in unsent:
            self._resend(specs, lease)

    async def _charge_debts(self) -> int:
        """Charge Redis what the local buckets handed out, waiting for its answer, for up
        to `DEBT_ROUNDS` round trips; the number of bucket charges applied.

        Raises a Redis error if a charge failed: it is owed again, and Redis is not back.
        """
        applied = 0
        for _ in range(DEBT_ROUNDS):
            charges = self._debts.collect(monotonic_ms())
            if not charges:
                break
            groups = _by_tenant(charges)
            # One call per tenant (its keys share a slot); on a single Redis all of them
            # travel in one round trip.
            replies = await asyncio.gather(
                *(self._store.adjust(group) for group in groups), return_exceptions=True
            )
            failed: BaseException | None = None
            for group, reply in zip(groups, replies, strict=True):
                if isinstance(reply, BaseException):
                    # Whether Redis applied it is unknown (an answer lost): it is charged
                    # again, as a limiter errs on the strict side.
                    self._debts.restore(group)
                    failed = reply
                else:
                    applied += len(group)
            if failed is not None:
                metrics.REDIS_ERRORS.labels("adjust").inc()
                raise failed
        return applied

    def _send_debts(self) -> int:
        """Queue the charges still owed ahead of any other call; the number queued."""
        charges = self._debts.collect(monotonic_ms())
        for group in _by_tenant(charges):
            sent = self._store.adjust_soon(group, urgent=True)
            sent.add_done_callback(functools.partial(self._debt_sent, charges=group))
        return len(charges)

    def _debt_sent(self, sent: asyncio.Future[Any], *, charges: list[BucketSpec]) -> None:
        if sent.cancelled():
            return
        exc = sent.exception()
        if exc is None:
            return
        # Owed still, charged when Redis is back again.
        self._debts.restore(charges)
        if isinstance(exc, REDIS_ERRORS):
            metrics.REDIS_ERRORS.labels("adjust").inc()
            self.mark_down(exc)
        else:
            log.error("charging Redis for local admissions failed", exc_info=exc)

    def close(self) -> None:
        """Stop probing for Redis."""
        if self._probe is not None:
            self._probe.cancel()


def _by_tenant(charges: Sequence[BucketSpec]) -> list[list[BucketSpec]]:
    """`charges` grouped by their key's hash tag (`prefix:{tenant}`), one group a call."""
    groups: dict[str, list[BucketSpec]] = {}
    for charge in charges:
        groups.setdefault(charge.key[: charge.key.index("}") + 1], []).append(charge)
    return list(groups.values())
