"""What choosing a replica costs per request: the ring key of a prompt (its leading KV
blocks hashed, or its session) and the bounded-load walk, against least load.

    python -m loadtest.routing_cost

In-process, no network: the figures are the choice's own CPU time, to set beside the
request path's (docs/benchmarks.md). Prompts of 1 KB and 32 KB, four replicas.
"""

from __future__ import annotations

import argparse
import functools
import timeit
from collections.abc import Callable

from gateway.config import Routing, RoutingPolicy
from gateway.inference.types import RequestKind, SamplingParams, UpstreamCall
from gateway.upstream.affinity import routing_key
from gateway.upstream.pool import ReplicaPool

REPLICAS = [f"http://10.0.0.{i}:8000" for i in range(1, 5)]
ROUTING = Routing(policy=RoutingPolicy.CACHE_AWARE)


def call(prompt_bytes: int, session: str | None = None) -> UpstreamCall:
    text = ("All work and no play makes a dull prompt. " * (prompt_bytes // 40 + 1))[:prompt_bytes]
    return UpstreamCall(
        kind=RequestKind.CHAT,
        upstream_model="m",
        prompt=text,
        messages=(),
        params=SamplingParams(max_tokens=16),
        prompt_estimate=prompt_bytes // 4,
        session=session,
    )


def choose(pool: ReplicaPool, request: UpstreamCall) -> object:
    """What the router does per request: the key, then the choice."""
    return pool.choose(key=routing_key(request, ROUTING))


def per_call_us(work: Callable[[], object], number: int) -> float:
    """The best of five runs of `number` calls, in microseconds a call."""
    return min(timeit.repeat(work, number=number, repeat=5)) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=20_000)
    args = parser.parse_args()
    pool = ReplicaPool(REPLICAS)
    for replica, load in zip(pool.replicas, [3, 1, 2, 0], strict=True):
        replica.outstanding = load
    print("| prompt | ring key (µs) | key + bounded-load choice (µs) | least load (µs) |")
    print("|---|---|---|---|")
    rows = [
        ("1 KB", call(1024)),
        ("32 KB", call(32 * 1024)),
        ("32 KB, session", call(32 * 1024, "conv-1")),
    ]
    for label, request in rows:
        key_us = per_call_us(functools.partial(routing_key, request, ROUTING), args.number)
        both_us = per_call_us(functools.partial(choose, pool, request), args.number)
        least_us = per_call_us(pool.choose, args.number)
        print(f"| {label} | {key_us:.2f} | {both_us:.2f} | {least_us:.2f} |")


if __name__ == "__main__":
    main()
