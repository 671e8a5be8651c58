"""One placement leader among many gateways: a lease, fenced by a token.

Two leases keep the same promise (`PlacementLease`): one in Redis (below), and a
Kubernetes `Lease` object (gateway_control.placement.kubernetes_lease).

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
from typing import Protocol

from redis.commands.core import AsyncScript

from gateway.storage.redis_client import REDIS_ERRORS, RedisClient
from gateway.storage.scripts import read_script

log = logging.getLogger("gateway.placement")

ACQUIRE_LUA = read_script("lease_acquire.lua")
CHECK_LUA = read_script("lease_check.lua")
RELEASE_LUA = read_script("lease_release.lua")


class LostLeadership(Exception):
    """The lease is no longer this gateway's (or cannot be checked): it must not act."""


class LeaseUnavailable(Exception):
    """The lease's store (Redis, the Kubernetes API) cannot be reached."""


class PlacementLease(Protocol):
    """What the placement controller needs of a lease."""

    holder: str
    token: int  # the fencing token while held, else 0
    ttl_ms: int
    keys: LeaseKeys  # where the placement is published (in Redis)

    @property
    def held(self) -> bool: ...

    async def campaign(self) -> int:
        """Take the lease if it is free or expired, renew it if it is ours; the token, or
        0. LeaseUnavailable when its store cannot be reached."""
        ...

    async def fence(self) -> None:
        """Raise LostLeadership unless the lease is still ours under our token."""
        ...

    async def release(self) -> None:
        """Give the lease up now, if it is ours."""
        ...


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
        try:
            self.token = int(await self._acquire(keys=keys, args=[self.holder, self.ttl_ms]))
        except REDIS_ERRORS as exc:
            self.token = 0  # unrenewed, it may expire any moment: not ours to act on
            raise LeaseUnavailable(f"Redis: {exc}") from exc
        return self.token

    async def fence(self) -> None:
        """Raise LostLeadership unless the lease is still ours under our token."""
        if not self.held:
            raise LostLeadership("not the placement leader")
        try:
            ours = await self._check(keys=[self.keys.lease], args=[self.holder, self.token])
        except REDIS_ERRORS as exc:
            raise LostLeadership(f"the placement lease cannot be checked: {exc}") from exc
        if not ours:
            token, self.token = self.token, 0
            raise LostLeadership(f"the placement lease (token {token}) is no longer ours")

    async def release(self) -> None:
        """Give the lease up now, if it is ours."""
        if self.held:
            await self._release(keys=[self.keys.lease], args=[self.holder, self.token])
            self.token = 0
