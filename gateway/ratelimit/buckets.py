"""Token buckets and concurrency leases: the types, the key names, and an in-process store.

A bucket holds up to `capacity` tokens and refills `refill_per_ms` tokens per ms. Its state
is (level, ts_ms): on every call level = min(capacity, level + (now - ts) * refill_per_ms),
and a bucket that does not exist yet is full. A take is all or nothing across the buckets
(and the lease) of one request. A lease is a slot of a tenant's concurrency limit, held by
one member (a request id) until it is released or its TTL passes.

`LocalBuckets` does exactly what the Lua scripts in `lua/` do, float for float, with the
clock passed in: it is the fallback when Redis is down and the model the tests replay the
scripts' decisions against. `LocalDebts` keeps what the local buckets handed out while
Redis was away, to be charged to Redis when it is back. Nothing here does I/O.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from gateway.storage.redis_keys import hash_tag

# Idle keys live this much longer than it takes them to refill (a full bucket and a
# missing one are the same state, so expiring after that point changes nothing).
EXPIRE_MARGIN_MS = 1000
# Waits are capped at 2^53 ms (about 285,000 years), beyond which floats skip whole ms.
MAX_WAIT_MS = 2**53
# The refill rates that make a bucket a spend budget of a calendar period (take.lua):
# whole again at the start of each UTC day or month, by Redis's clock. Locally (Redis
# down) such a bucket does not refill: a period that begins in an outage begins when
# Redis is back.
DAY_BUDGET = -1.0
MONTH_BUDGET = -2.0
PERIOD_RATES = (DAY_BUDGET, MONTH_BUDGET)


@dataclass(frozen=True, slots=True)
class BucketSpec:
    """One bucket of a request: where it lives, its limits, and what this call takes.

    For `take`, `cost` is what the request needs (>= 0). For `adjust`, `cost` is the signed
    change: positive charges more (the level may go negative, a debt), negative refunds.
    """

    key: str
    capacity: float
    refill_per_ms: float
    cost: float

    def __post_init__(self) -> None:
        # Written as positive checks so NaN fails them too.
        if not (0 < self.capacity < math.inf):
            raise ValueError(f"bucket {self.key}: capacity must be positive, not {self.capacity}")
        if not (0 <= self.refill_per_ms < math.inf or self.refill_per_ms in PERIOD_RATES):
            raise ValueError(
                f"bucket {self.key}: refill_per_ms must be >= 0, not {self.refill_per_ms}"
            )
        if not math.isfinite(self.cost):
            raise ValueError(f"bucket {self.key}: cost must be finite, not {self.cost}")


@dataclass(frozen=True, slots=True)
class LeaseSpec:
    """A concurrency slot: `member` (unique per request) in the ZSET at `key`.

    At most `limit` unexpired members are held at once; a member holds its slot for
    `ttl_ms` after it was taken or last renewed.
    """

    key: str
    member: str
    limit: int
    ttl_ms: float


@dataclass(frozen=True, slots=True)
class BucketState:
    """What a bucket store keeps per bucket."""

    level: float
    ts_ms: float


@dataclass(frozen=True, slots=True)
class BucketResult:
    """One bucket's part of a take.

    `allowed` says whether this bucket held its cost, even when another bucket or the lease
    refused the request (so the caller can tell which limit refused). `remaining` is the
    level after the call (negative while in debt). `retry_after_ms` is the fewest whole ms
    until the bucket holds the cost (0 if it does now; -1 if it never will: the cost exceeds
    the capacity, or nothing refills). `reset_ms` is the whole ms until full (-1: never).
    """

    allowed: bool
    remaining: float
    retry_after_ms: int
    reset_ms: int


@dataclass(frozen=True, slots=True)
class LeaseResult:
    """The lease's part of a take: whether a slot was free, and how many are held after."""

    allowed: bool
    in_flight: int


@dataclass(frozen=True, slots=True)
class TakeResult:
    """The outcome of one take; `now_ms` is the clock it was decided at (Redis TIME)."""

    allowed: bool
    buckets: list[BucketResult]
    lease: LeaseResult | None
    now_ms: float

    @property
    def retry_after_ms(self) -> int:
        """How long a refused request should wait: the longest wait of a refusing bucket.

        -1 if some bucket can never hold its cost; 0 if allowed, or if only the lease
        refused (a slot frees when a request ends, which no clock predicts).
        """
        wait = 0
        for bucket in self.buckets:
            if bucket.retry_after_ms < 0:
                return -1
            wait = max(wait, bucket.retry_after_ms)
        return wait


@dataclass(frozen=True, slots=True)
class AdjustResult:
    """The outcome of one adjust.

    `remaining` holds each bucket's level after the call, in the order given. `lease_held`
    is True if the released or renewed member held an unexpired slot.
    """

    remaining: list[float]
    lease_held: bool
    now_ms: float


@dataclass(frozen=True, slots=True)
class BucketKeys:
    """The Redis keys of one tenant and model; all share the tenant's hash tag (one slot)."""

    requests: str
    tokens: str
    model_requests: str
    model_tokens: str
    inflight: str


def bucket_key(prefix: str, tenant: str, kind: str, model: str | None = None) -> str:
    """One key of `tenant`: `{prefix}:{{tenant}}:{kind}`, then `:{model}` if given.

    E.g. `gw:{acme}:requests`, `gw:{acme}:tokens:llm-large`, `gw:{acme}:inflight`.
    """
    if "{" in prefix or "}" in prefix:
        # A brace in the prefix would make it the hash tag: every tenant on one slot.
        raise ValueError(f"key prefix must not contain braces: {prefix!r}")
    key = f"{prefix}:{{{hash_tag(tenant)}}}:{kind}"
    return key if model is None else f"{key}:{model}"


@lru_cache(maxsize=4096)
def bucket_keys(prefix: str, tenant: str, model: str) -> BucketKeys:
    """Every key of `tenant` using `model` (cached: a dict lookup on the request path)."""
    return BucketKeys(
        requests=bucket_key(prefix, tenant, "requests"),
        tokens=bucket_key(prefix, tenant, "tokens"),
        model_requests=bucket_key(prefix, tenant, "requests", model),
        model_tokens=bucket_key(prefix, tenant, "tokens", model),
        inflight=bucket_key(prefix, tenant, "inflight"),
    )


def check_costs(buckets: Sequence[BucketSpec]) -> None:
    """Refuse a take of a negative cost: it would add tokens (refunds go through adjust)."""
    for b in buckets:
        if b.cost < 0:
            raise ValueError(f"bucket {b.key}: a take's cost must be >= 0, not {b.cost}")


def monotonic_ms() -> float:
    """A clock for `LocalBuckets` as the in-process fallback (never goes back)."""
    return time.monotonic() * 1000.0


def wait_ms(level: float, target: float, rate: float) -> int:
    """The fewest whole ms after which `level + ms * rate >= target`: 0 now, -1 never.

    Exact for the refill expression itself (the rounded quotient is corrected by a step),
    capped at `MAX_WAIT_MS`. The Lua scripts compute the same.
    """
    if level >= target:
        return 0
    if rate <= 0:
        return -1
    x = (target - level) / rate
    if x >= MAX_WAIT_MS:
        return MAX_WAIT_MS
    w = math.ceil(x)
    if level + w * rate < target:
        w += 1
    elif w > 1 and level + (w - 1) * rate >= target:
        w -= 1
    return w


class LocalBuckets:
    """Buckets and leases in this process, with the semantics of `take.lua`/`adjust.lua`.

    Every method takes the clock as `now_ms`. Idle entries are dropped once they would have
    expired in Redis, checked on access and swept every `sweep_every` writes.
    """

    def __init__(self, sweep_every: int = 4096) -> None:
        # key -> (level, ts_ms, expires_at_ms)
        # key -> (level, ts_ms, expires_at_ms, the capacity the level was counted from)
        self._buckets: dict[str, tuple[float, float, float, float]] = {}
        # key -> (member -> expiry ms, key expires_at_ms)
        self._leases: dict[str, tuple[dict[str, float], float]] = {}
        self._sweep_every = sweep_every
        self._writes = 0

    def take(
        self, buckets: Sequence[BucketSpec], lease: LeaseSpec | None, now_ms: float
    ) -> TakeResult:
        """Take every bucket's cost and a lease slot at `now_ms`, or nothing at all."""
        check_costs(buckets)
        now = float(now_ms)
        refilled = [
            self._refill(b.key, float(b.capacity), float(b.refill_per_ms), now) for b in buckets
        ]
        holds = [
            float(b.cost) <= float(b.capacity) and level >= float(b.cost)
            for b, (level, _) in zip(buckets, refilled, strict=True)
        ]
        ok = all(holds)

        lease_result: LeaseResult | None = None
        if lease is not None:
            members = self._live_members(lease.key, now)
            held = lease.member in members
            lease_ok = held or len(members) < lease.limit
            ok = ok and lease_ok
            if ok:
                members[lease.member] = now + float(lease.ttl_ms)
                self._extend_lease_key(lease.key, members, now, float(lease.ttl_ms))
            lease_result = LeaseResult(lease_ok, len(members))

        results: list[BucketResult] = []
        for b, (level, ts), has in zip(buckets, refilled, holds, strict=True):
            cap, rate, cost = float(b.capacity), float(b.refill_per_ms), float(b.cost)
            retry = 0
            if ok:
                level = min(cap, level - cost)
            elif cost > cap:
                retry = -1
            else:
                retry = wait_ms(level, cost, rate)
            reset = wait_ms(level, cap, rate)
            self._store(b.key, level, ts, now, reset, cap)
            results.append(BucketResult(has, level, retry, reset))
        return TakeResult(ok, results, lease_result, now)

    def seed(
        self, key: str, level: float, capacity: float, refill_per_ms: float, now_ms: float
    ) -> None:
        """Set the bucket at `key` to `level` at `now_ms`: the state another store (Redis)
        last reported, so that these buckets carry on from it rather than from full."""
        level = min(capacity, max(0.0, level))
        self._store(key, level, now_ms, now_ms, wait_ms(level, capacity, refill_per_ms), capacity)

    def adjust(
        self,
        bucket: BucketSpec | Sequence[BucketSpec] | None,
        release: LeaseSpec | None,
        now_ms: float,
        renew: LeaseSpec | None = None,
    ) -> AdjustResult:
        """Charge (cost > 0) or refund (cost < 0) buckets at `now_ms`; release or renew a lease.

        Refunds stop at the capacity; charges may leave a debt that refill pays off.
        """
        if release is not None and renew is not None:
            raise ValueError("release and renew exclude each other")
        now = float(now_ms)
        specs = _as_specs(bucket)
        remaining: list[float] = []
        for b in specs:
            cap, rate = float(b.capacity), float(b.refill_per_ms)
            level, ts = self._refill(b.key, cap, rate, now)
            level = min(cap, level - float(b.cost))
            self._store(b.key, level, ts, now, wait_ms(level, cap, rate), cap)
            remaining.append(level)

        held = False
        lease = release or renew
        if lease is not None:
            members = self._live_members(lease.key, now)
            held = lease.member in members
            if held and release is not None:
                del members[lease.member]
            elif held:
                members[lease.member] = now + float(lease.ttl_ms)
                self._extend_lease_key(lease.key, members, now, float(lease.ttl_ms))
            if not members:
                self._leases.pop(lease.key, None)
        return AdjustResult(remaining, held, now)

    def level(self, key: str, capacity: float, refill_per_ms: float, now_ms: float) -> float:
        """The level of the bucket at `key` at `now_ms`, refilled (full if missing); the
        bucket is not changed."""
        return self._refill(key, float(capacity), float(refill_per_ms), float(now_ms))[0]

    def state(self, key: str, now_ms: float) -> BucketState | None:
        """The stored state of a bucket (as of its last call), or None if it has expired."""
        entry = self._buckets.get(key)
        if entry is None or entry[2] < now_ms:
            return None
        return BucketState(entry[0], entry[1])

    def in_flight(self, key: str, now_ms: float) -> int:
        """How many unexpired leases the ZSET at `key` holds at `now_ms`."""
        return len(self._live_members(key, float(now_ms)))

    def __len__(self) -> int:
        """Stored buckets and lease sets (expired ones included until swept)."""
        return len(self._buckets) + len(self._leases)

    def sweep(self, now_ms: float) -> None:
        """Drop every bucket and lease set that Redis would have expired by `now_ms`."""
        self._buckets = {k: e for k, e in self._buckets.items() if e[2] >= now_ms}
        self._leases = {k: e for k, e in self._leases.items() if e[1] >= now_ms}

    def _refill(self, key: str, cap: float, rate: float, now: float) -> tuple[float, float]:
        entry = self._buckets.get(key)
        if entry is None or entry[2] < now:
            level, ts = cap, now  # a missing (expired) bucket is full
        else:
            level, ts = entry[0], entry[1]
            if rate <= 0:
                # A budget whose amount changed keeps what was spent (as take.lua).
                level += cap - entry[3]
        elapsed = now - ts
        if elapsed < 0:
            elapsed = 0.0  # the clock went back: no refill until it passes ts again
        else:
            ts = now
        if rate <= 0:  # never refills (a total budget), or a period's (see PERIOD_RATES)
            return min(cap, level), ts
        return min(cap, level + elapsed * rate), ts

    def _store(
        self, key: str, level: float, ts: float, now: float, reset: int, capacity: float
    ) -> None:
        expires = math.inf if reset < 0 else now + reset + EXPIRE_MARGIN_MS
        self._buckets[key] = (level, ts, expires, capacity)
        self._writes += 1
        if self._writes % self._sweep_every == 0:
            self.sweep(now)

    def _live_members(self, key: str, now: float) -> dict[str, float]:
        """The lease ZSET at `key` without its expired members (a new, unstored dict if none)."""
        entry = self._leases.get(key)
        if entry is None or entry[1] < now:
            return {}
        members = entry[0]
        for member in [m for m, expiry in members.items() if expiry <= now]:
            del members[member]
        return members

    def _extend_lease_key(
        self, key: str, members: dict[str, float], now: float, ttl: float
    ) -> None:
        entry = self._leases.get(key)
        expires = now + ttl + EXPIRE_MARGIN_MS
        if entry is not None and entry[0] is members and entry[1] >= expires:
            return
        self._leases[key] = (members, expires)


@dataclass(slots=True)
class _Untouched:
    """A tracked bucket's copy that nothing is taken from, and the limits of both."""

    # The local bucket's limits (this gateway's share) and the whole bucket's (Redis's).
    capacity: float
    refill_per_ms: float
    whole_capacity: float
    whole_refill_per_ms: float
    # The level the local bucket would hold at `ts_ms` had nothing been taken from it.
    level: float
    ts_ms: float

    def at(self, now_ms: float) -> float:
        """The copy's level at `now_ms`: refilled, never above the capacity."""
        elapsed = max(0.0, float(now_ms) - self.ts_ms)
        return min(self.capacity, self.level + elapsed * max(0.0, self.refill_per_ms))


class LocalDebts:
    """What this process owes the shared buckets for what its `LocalBuckets` handed out.

    While Redis is unreachable the local buckets decide, and Redis's own buckets refill all
    the while: without a reckoning, a tenant would get that refill twice, once locally
    during the outage and once from Redis after it. Each bucket key the local buckets
    decide on is tracked from its first local take, beside a copy of itself that nothing
    is taken from (same capacity, same refill). What Redis is owed for the key is the
    copy's level less the local bucket's own: every take and charge since, less refunds,
    less whatever refill the untouched copy would have lost at its capacity. Charging that
    to Redis leaves it at the level the local bucket ended at (summed over the gateways,
    each owing for its own share): a tenant that emptied its bucket is empty again, and
    one that kept to its rate through a long outage is not locked out for the outage's
    length after it.

    One entry per bucket key (tenants x models at most) in each of its two maps.
    """

    def __init__(self, local: LocalBuckets) -> None:
        self._local = local
        self._tracked: dict[str, _Untouched] = {}
        # Collected but not applied by Redis (the call failed): owed at the next collect.
        self._carried: dict[str, BucketSpec] = {}

    def __len__(self) -> int:
        """Bucket keys that owe something or are tracked."""
        return len(self._tracked.keys() | self._carried.keys())

    def track(self, local: BucketSpec, whole: BucketSpec, now_ms: float) -> None:
        """Call before each local take of `local` (this gateway's share of the bucket
        `whole`): the first one starts the untouched copy at the local bucket's level."""
        copy = self._tracked.get(local.key)
        if copy is None:
            level = self._local.level(local.key, local.capacity, local.refill_per_ms, now_ms)
            self._tracked[local.key] = _Untouched(
                local.capacity,
                local.refill_per_ms,
                whole.capacity,
                whole.refill_per_ms,
                level,
                float(now_ms),
            )
            return
        # A reload may have changed the limits: the latest apply from now on.
        copy.level, copy.ts_ms = copy.at(now_ms), max(copy.ts_ms, float(now_ms))
        copy.capacity, copy.refill_per_ms = local.capacity, local.refill_per_ms
        copy.whole_capacity, copy.whole_refill_per_ms = whole.capacity, whole.refill_per_ms

    def collect(self, now_ms: float) -> list[BucketSpec]:
        """What each bucket owes at `now_ms`, as charges to the whole bucket (a negative
        cost is a refund: a reservation refunded after its take was collected). Tracking
        goes on from here, so nothing is collected twice."""
        charges = self._carried
        self._carried = {}
        for key, copy in self._tracked.items():
            level = self._local.level(key, copy.capacity, copy.refill_per_ms, now_ms)
            amount = copy.at(now_ms) - level
            copy.level, copy.ts_ms = level, max(copy.ts_ms, float(now_ms))
            if amount:
                earlier = charges[key].cost if key in charges else 0.0
                charges[key] = BucketSpec(
                    key, copy.whole_capacity, copy.whole_refill_per_ms, earlier + amount
                )
        return [charge for charge in charges.values() if charge.cost]

    def restore(self, charges: Sequence[BucketSpec]) -> None:
        """Owe `charges` again: they were collected, but Redis may not have applied them."""
        for charge in charges:
            earlier = self._carried.get(charge.key)
            cost = charge.cost + (earlier.cost if earlier is not None else 0.0)
            self._carried[charge.key] = BucketSpec(
                charge.key, charge.capacity, charge.refill_per_ms, cost
            )

    def stop_tracking(self) -> None:
        """Forget the untouched copies (the local buckets no longer decide); what was
        restored stays owed."""
        self._tracked.clear()


def _as_specs(bucket: BucketSpec | Sequence[BucketSpec] | None) -> Sequence[BucketSpec]:
    if bucket is None:
        return ()
    if isinstance(bucket, BucketSpec):
        return (bucket,)
    return bucket
