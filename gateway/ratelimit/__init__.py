"""Per-tenant rate limits: token buckets and concurrency leases in Redis (Lua), and a
pure-Python store with the same semantics for tests and for when Redis is down."""

from gateway.ratelimit.buckets import (
    AdjustResult,
    BucketKeys,
    BucketResult,
    BucketSpec,
    BucketState,
    LeaseResult,
    LeaseSpec,
    LocalBuckets,
    TakeResult,
    bucket_key,
    bucket_keys,
    monotonic_ms,
)
from gateway.ratelimit.key_quota import KeyQuota
from gateway.ratelimit.redis_store import RedisBuckets

__all__ = [
    "AdjustResult",
    "BucketKeys",
    "BucketResult",
    "BucketSpec",
    "BucketState",
    "KeyQuota",
    "LeaseResult",
    "LeaseSpec",
    "LocalBuckets",
    "RedisBuckets",
    "TakeResult",
    "bucket_key",
    "bucket_keys",
    "monotonic_ms",
]
