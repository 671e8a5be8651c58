"""One placement leader among many gateways: a lease in Redis, fenced by a token.

Every gateway campaigns: it runs `lease_acquire.lua` every `ttl / 3`. The lease is a key
that expires after `ttl`; the gateway holding it renews it, the others find it taken. A
gateway that takes a free lease gets a fencing token greater than any before (`INCR`).

Only the holder may act (load and unload models on Triton nodes), and before **every**
repository call it checks, in Redis, that the lease is still its own under its token
(`fence()`): a leader that stalled past its lease (a long pause, a partition from Redis)
and woke up finds a newer token there and stops before acting. What the check cannot
cover is a call already on the wire when the lease ran out: the gap is one repository
call, bounded by its timeout.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from dataclasses import dataclass

from redis.commands.core import AsyncScript

from gateway.storage.redis_client import RedisClient
from gateway.storage.scripts import read_script

log = logging.getLogger("gateway.placement")

ACQUIRE_LUA = read_script("lease_acquire.lua")
CHECK_LUA = read_script("lease_check.lua")
RELEASE_LUA = read_script("lease_release.lua")


class LostLeadership(Exception):
    """The lease is no longer this gateway's: it must not act."""


def holder_id() -> str:
    """This process among all gateways: host, pid and a random part (a restarted
    process with the same pid is another holder)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True, slots=True)
class LeaseKeys:
    lease: str
    token: str
    plan: str  # the leader's published placement, read by the others

    @classmethod
    def for_prefix(cls, prefix: str) -> LeaseKeys:
        # One hash tag: the script's keys live on one Redis Cluster slot.
        return cls(f"{prefix}:{{placement}}:leader", f"{prefix}:{{placement}}:token",
                   f"{prefix}:{{placement}}:plan")  # fmt: skip


class RedisLease:
    """The placement lease of one gateway, in Redis."""

    def __init__(self, redis: RedisClient, prefix: str, ttl_s: float, holder: str = "") -> None:
        self.keys = LeaseKeys.for_prefix(prefix)
        self.holder = holder or holder_id()
        self.ttl_ms = max(1, round(ttl_s * 1000))
        self.token = 0  # the fencing token while held, else 0
        self._redis = redis
        self._acquire: AsyncScript = redis.register_script(ACQUIRE_LUA)
        self._check: AsyncScript = redis.register_script(CHECK_LUA)
        self._release: AsyncScript = redis.register_script(RELEASE_LUA)

    @property
    def held(self) -> bool:
        return self.token > 0

    async def campaign(self) -> int:
        """Take the lease if it is free, renew it if it is ours; the token, or 0."""
        keys = [self.keys.lease, self.keys.token]
        self.token = int(await self._acquire(keys=keys, args=[self.holder, self.ttl_ms]))
        return self.token

    async def fence(self) -> None:
        """Raise LostLeadership unless the lease is still ours under our token."""
        if not self.held:
            raise LostLeadership("not the placement leader")
        ours = await self._check(keys=[self.keys.lease], args=[self.holder, self.token])
        if not ours:
            token, self.token = self.token, 0
            raise LostLeadership(f"the placement lease (token {token}) is no longer ours")

    async def release(self) -> None:
        """Give the lease up now, if it is ours."""
        if self.held:
            await self._release(keys=[self.keys.lease], args=[self.holder, self.token])
            self.token = 0
