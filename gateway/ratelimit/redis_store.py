"""Token buckets in Redis: one EVALSHA per take, one per adjust.

The scripts live in `gateway/ratelimit/lua/` (package data, so an installed gateway has
them too). They are read once at import and registered with redis-py, which calls them
by SHA and loads them again when the server answers NOSCRIPT (after a restart, a
failover, or SCRIPT FLUSH). Redis errors propagate as redis-py exceptions: the caller
decides whether a dead Redis fails open, fails closed, or falls back to `LocalBuckets`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from importlib.resources import files
from typing import Any

from redis.asyncio import Redis, RedisCluster
from redis.exceptions import NoScriptError

from gateway.ratelimit.buckets import (
    AdjustResult,
    BucketResult,
    BucketSpec,
    LeaseResult,
    LeaseSpec,
    TakeResult,
)

_LUA = files(__package__) / "lua"
TAKE_LUA = (_LUA / "take.lua").read_text(encoding="utf-8")
ADJUST_LUA = (_LUA / "adjust.lua").read_text(encoding="utf-8")

# adjust.lua's lease operations (ARGV[2]).
_NO_LEASE, _RELEASE, _RENEW = 0, 1, 2


class RedisBuckets:
    """The bucket store shared by every gateway replica: a Redis server or Redis Cluster.

    All keys of one call must share a hash tag (see `bucket_keys`), so a call touches one
    cluster slot. The decisions are exactly those of `LocalBuckets` at the returned `now_ms`.
    """

    def __init__(self, redis: Redis | RedisCluster) -> None:
        self._redis = redis
        self._take = redis.register_script(TAKE_LUA)
        self._adjust = redis.register_script(ADJUST_LUA)

    async def load_scripts(self) -> None:
        """Load both scripts now (optional: the first call would load them on NOSCRIPT)."""
        await self._redis.script_load(TAKE_LUA)
        await self._redis.script_load(ADJUST_LUA)

    async def take(
        self, buckets: Sequence[BucketSpec], lease: LeaseSpec | None = None
    ) -> TakeResult:
        """Take every bucket's cost and a lease slot, or nothing: one round trip."""
        keys = [b.key for b in buckets]
        args: list[Any] = [len(keys)]
        for b in buckets:
            args += (b.capacity, b.refill_per_ms, b.cost)
        if lease is not None:
            keys.append(lease.key)
            args += (lease.member, lease.limit, lease.ttl_ms)
        reply = await self._take(keys, args)

        results: list[BucketResult] = []
        i = 2
        for _ in buckets:
            results.append(
                BucketResult(reply[i] == 1, float(reply[i + 1]), reply[i + 2], reply[i + 3])
            )
            i += 4
        lease_result = None if lease is None else LeaseResult(reply[i] == 1, reply[i + 1])
        return TakeResult(reply[0] == 1, results, lease_result, float(reply[1]))

    async def adjust(
        self,
        bucket: BucketSpec | Sequence[BucketSpec] | None,
        release: LeaseSpec | None = None,
        renew: LeaseSpec | None = None,
    ) -> AdjustResult:
        """Charge (cost > 0) or refund (cost < 0) buckets; release or renew a lease: one call.

        Refunds stop at the capacity; charges may leave a debt that refill pays off.
        Renewing a lease that has already expired does not bring it back
        (`lease_held` is False then).
        """
        keys, args = _adjust_call(bucket, release, renew)
        reply = await self._adjust(keys, args)
        return AdjustResult([float(r) for r in reply[2:]], reply[1] == 1, float(reply[0]))

    async def adjust_many(
        self, calls: Sequence[tuple[Sequence[BucketSpec], LeaseSpec | None]]
    ) -> None:
        """Several adjusts (buckets, lease to release) in one pipelined round trip.

        For the settles of many requests at once: under load they cost one round trip
        together instead of one each (on Redis Cluster, one concurrent call each).
        """
        if not calls:
            return
        if isinstance(self._redis, RedisCluster):
            # redis-py blocks EVALSHA in cluster pipelines: concurrent calls instead, one
            # per request, each to the node of its tenant's slot.
            await asyncio.gather(
                *(self._adjust(*_adjust_call(specs, release, None)) for specs, release in calls)
            )
            return
        for attempt in range(2):
            pipe = self._redis.pipeline(transaction=False)
            for specs, release in calls:
                keys, args = _adjust_call(specs, release, None)
                pipe.evalsha(self._adjust.sha, len(keys), *keys, *args)
            try:
                await pipe.execute()
                return
            except NoScriptError:
                if attempt:
                    raise
                # Redis lost its scripts (restart, failover, SCRIPT FLUSH): load, try again.
                await self._redis.script_load(ADJUST_LUA)


def _adjust_call(
    bucket: BucketSpec | Sequence[BucketSpec] | None,
    release: LeaseSpec | None,
    renew: LeaseSpec | None,
) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of one adjust.lua call."""
    if isinstance(bucket, BucketSpec):
        specs: Sequence[BucketSpec] = (bucket,)
    elif bucket is None:
        specs = ()
    else:
        specs = bucket
    keys = [b.key for b in specs]
    args: list[Any] = [len(keys), _NO_LEASE]
    for b in specs:
        args += (b.capacity, b.refill_per_ms, b.cost)
    if release is not None and renew is not None:
        raise ValueError("release and renew exclude each other")
    if release is not None:
        args[1] = _RELEASE
        keys.append(release.key)
        args += (release.member, release.ttl_ms)
    elif renew is not None:
        args[1] = _RENEW
        keys.append(renew.key)
        args += (renew.member, renew.ttl_ms)
    return keys, args
