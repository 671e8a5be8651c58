"""What the integration tests share: one Redis to run the scripts on, and fresh keys."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from redis.asyncio import Redis, RedisCluster

from gateway.ratelimit.redis_store import RedisBuckets


@dataclass
class Backend:
    """One Redis to run the scripts on: the client (for inspection) and the store."""

    name: str
    client: Redis | RedisCluster
    store: RedisBuckets


def fresh_tenant() -> str:
    # Servers live for the whole session: every test (and example) gets its own keys.
    return f"t-{uuid.uuid4().hex[:12]}"
