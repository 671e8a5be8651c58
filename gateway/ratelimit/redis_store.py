"""Token buckets in Redis: one script call per take, one per adjust.

The scripts are `lua/take.lua` and `lua/adjust.lua` (`gateway.storage.scripts` finds them,
installed or not). They are read once at import, called by SHA and loaded again when the
server answers NOSCRIPT (after a restart, a failover, or SCRIPT FLUSH). On a single Redis the
calls of concurrent requests share pipelined round trips (`ScriptCoalescer`); on Redis
Cluster each call goes to the node of its tenant's slot on its own. Redis errors
propagate as redis-py exceptions: the caller decides whether a dead Redis fails open,
fails closed, or falls back to `LocalBuckets`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Sequence
from typing import Any, Literal

from redis.asyncio import Redis, RedisCluster
from redis.commands.core import AsyncScript

from gateway.ratelimit.buckets import (
    AdjustResult,
    BucketResult,
    BucketSpec,
    LeaseResult,
    LeaseSpec,
    TakeResult,
    check_costs,
)
from gateway.ratelimit.coalescer import PackedCall, RoundTripObserver, ScriptCoalescer
from gateway.storage.scripts import read_script

TAKE_LUA = read_script("take.lua")
ADJUST_LUA = read_script("adjust.lua")

# adjust.lua's lease operations (ARGV[2]).
NO_LEASE, RELEASE, RENEW = 0, 1, 2


class RedisBuckets:
    """The bucket store shared by every gateway replica: a Redis server or Redis Cluster.

    All keys of one call must share a hash tag (see `bucket_keys`), so a call touches one
    cluster slot. The decisions are exactly those of `LocalBuckets` at the returned `now_ms`.
    """

    def __init__(
        self, redis: Redis | RedisCluster, observe: RoundTripObserver | None = None
    ) -> None:
        self._redis = redis
        self._observe = observe
        self._take = redis.register_script(TAKE_LUA)
        self._adjust = redis.register_script(ADJUST_LUA)
        # redis-py refuses EVALSHA in cluster pipelines: there, every call goes alone.
        self._coalescer = (
            None if isinstance(redis, RedisCluster) else ScriptCoalescer(redis, observe)
        )

    async def load_scripts(self) -> None:
        """Load both scripts now (optional: the first call would load them on NOSCRIPT)."""
        await self._redis.script_load(TAKE_LUA)
        await self._redis.script_load(ADJUST_LUA)

    async def _run(self, script: AsyncScript, keys: list[str], args: list[Any]) -> Any:
        """A call the caller waits for: with the calls of the moment, or alone."""
        if self._coalescer is not None:
            return await self._coalescer.call(script, keys, args)
        return await self._call_alone(script, keys, args)

    async def _call_alone(
        self, script: AsyncScript, keys: Sequence[str], args: Sequence[Any]
    ) -> Any:
        started = time.perf_counter()
        reply = await script(keys, args)
        if self._observe is not None:
            self._observe(1, time.perf_counter() - started)
        return reply

    async def take(
        self, buckets: Sequence[BucketSpec], lease: LeaseSpec | None = None
    ) -> TakeResult:
        """Take every bucket's cost and a lease slot, or nothing: one round trip."""
        check_costs(buckets)
        keys = [b.key for b in buckets]
        args: list[Any] = [len(keys)]
        for b in buckets:
            args += (b.capacity, b.refill_per_ms, b.cost)
        if lease is not None:
            keys.append(lease.key)
            args += (lease.member, lease.limit, lease.ttl_ms)
        reply = await self._run(self._take, keys, args)
        return take_result(reply, len(buckets), lease is not None)

    def take_reply(
        self, keys: Sequence[str], args: Sequence[Any], packed: bytes | None = None
    ) -> Awaitable[Any]:
        """take.lua's own reply for KEYS and ARGV as `take` builds them (unchecked), for a
        caller that builds them once for many calls; `take_result` reads it. `packed`:
        the call packed by the `packer` of take.lua, sent instead where calls are
        coalesced (where `packer` gives one)."""
        if self._coalescer is not None:
            return self._coalescer.call(self._take, keys, args, packed=packed)
        return self._call_alone(self._take, keys, args)

    def packer(
        self,
        script: Literal["take", "adjust"],
        keys: Sequence[str],
        args: Sequence[Any],
        amount_at: Sequence[int],
        member_at: int | None = None,
        second_at: Sequence[int] = (),
    ) -> PackedCall | None:
        """A `PackedCall` of take.lua or adjust.lua for calls that differ only in two
        amounts (tokens, spend) and a lease member, or None where calls are not packed
        here (a Redis Cluster)."""
        if self._coalescer is None:
            return None
        sha = (self._take if script == "take" else self._adjust).sha
        return PackedCall(sha, keys, args, amount_at, member_at, second_at)

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
        keys, args = adjust_call(bucket, release, renew)
        reply = await self._run(self._adjust, keys, args)
        return AdjustResult([float(r) for r in reply[2:]], reply[1] == 1, float(reply[0]))

    def adjust_soon(
        self,
        buckets: Sequence[BucketSpec],
        release: LeaseSpec | None = None,
        renew: LeaseSpec | None = None,
        urgent: bool = False,
    ) -> asyncio.Future[Any]:
        """Charge or refund `buckets` and release or renew a lease, without waiting for
        the reply.

        For charges, settles and renewals off the request's critical path: under load
        they share round trips with the other calls of the moment. The future tells of
        errors. An `urgent` call goes out as an admission would, at the next turn of the
        loop; on a single Redis it is sent ahead of every call made after it.
        """
        keys, args = adjust_call(buckets, release, renew)
        return self.adjust_reply_soon(keys, args, urgent)

    def adjust_reply_soon(
        self,
        keys: Sequence[str],
        args: Sequence[Any],
        urgent: bool = False,
        packed: bytes | None = None,
    ) -> asyncio.Future[Any]:
        """`adjust_soon` with KEYS and ARGV as it builds them (unchecked), for a caller
        that builds them from parts made once; the future gets adjust.lua's own reply.
        `packed` as for `take_reply`."""
        if self._coalescer is not None:
            return self._coalescer.call(self._adjust, keys, args, urgent=urgent, packed=packed)
        return asyncio.ensure_future(self._call_alone(self._adjust, keys, args))

    async def close(self) -> None:
        """Wait for the calls already queued to be sent."""
        if self._coalescer is not None:
            await self._coalescer.close()


def take_result(reply: Any, buckets: int, lease: bool) -> TakeResult:
    """take.lua's reply for `buckets` buckets (and a lease key if `lease`), read."""
    results: list[BucketResult] = []
    i = 2
    for _ in range(buckets):
        results.append(BucketResult(reply[i] == 1, float(reply[i + 1]), reply[i + 2], reply[i + 3]))
        i += 4
    lease_result = LeaseResult(reply[i] == 1, reply[i + 1]) if lease else None
    return TakeResult(reply[0] == 1, results, lease_result, float(reply[1]))


def adjust_call(
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
    args: list[Any] = [len(keys), NO_LEASE]
    for b in specs:
        args += (b.capacity, b.refill_per_ms, b.cost)
    if release is not None and renew is not None:
        raise ValueError("release and renew exclude each other")
    if release is not None:
        args[1] = RELEASE
        keys.append(release.key)
        args += (release.member, release.ttl_ms)
    elif renew is not None:
        args[1] = RENEW
        keys.append(renew.key)
        args += (renew.member, renew.ttl_ms)
    return keys, args
