"""The rate limiter's own CPU per request: admit + settle against a real redis-server.

    .venv/bin/python -m loadtest.limiter_cost [--requests 32000] [--concurrency 32]
        [--rounds 5] [--profile 40] [--sort tottime] [--baseline DIR]

Builds the gateway's runtime from loadtest/bench-config (the `bench` tenant: a request
bucket, a token bucket and a concurrency lease, all far from refusing) against a
redis-server of its own, then runs `--concurrency` workers that each admit a request and
settle it, over and over, and divides the process's CPU time by the requests. That is
what `RateLimiter.admit` and `settle` cost a gateway worker, Redis's own CPU aside (it is
another process). `--profile N` prints cProfile's top N functions. Figures of one run
only compare with figures of the same run: `--baseline` runs another source tree's copy
of this file in a child process, interleaved round by round with this tree's.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import logging
import os
import pstats
import sys
import time
from pathlib import Path
from typing import Any

from loadtest.child_rounds import measure_by_turns, own_redis, print_figures, trees_to_measure

ROOT = Path(__file__).resolve().parent.parent
TENANT = "bench"
MODEL = "fake-llama-8b"
# What the gateway reserves for a short chat request (prompt plus max_tokens) and what
# such a request ends up using.
RESERVE_TOKENS = 25
USED_TOKENS = 12
# Settles left in the coalescer's queue are sent within its 2 ms background delay: the
# measurement waits this long (idle, costing no CPU) so that their cost is counted.
DRAIN_S = 0.02


async def _runtime(redis_url: str) -> Any:
    from gateway.config.loader import load_config
    from gateway.serving.runtime import Runtime

    os.environ["BENCH_REDIS_URL"] = redis_url
    # The bench config's upstreams are not running: their health warnings are noise here.
    logging.disable(logging.WARNING)
    runtime = Runtime.build(load_config(str(ROOT / "loadtest/bench-config/gateway.yaml")))
    await runtime.start()
    return runtime


async def _pairs(limiter: Any, count: int) -> None:
    for _ in range(count):
        decision = await limiter.admit(TENANT, MODEL, RESERVE_TOKENS, time.monotonic() + 30)
        if not decision.allowed or decision.reservation is None:
            raise SystemExit(f"refused: {decision}")
        limiter.settle(decision.reservation, USED_TOKENS)


async def _measure(
    limiter: Any, requests: int, concurrency: int, profile: cProfile.Profile | None
) -> float:
    """CPU seconds per admit + settle, `concurrency` workers at once."""
    await asyncio.gather(*(_pairs(limiter, 10) for _ in range(concurrency)))  # warm
    await asyncio.sleep(DRAIN_S)
    each = requests // concurrency
    cpu = time.process_time()
    if profile is not None:
        profile.enable()
    await asyncio.gather(*(_pairs(limiter, each) for _ in range(concurrency)))
    await asyncio.sleep(DRAIN_S)
    if profile is not None:
        profile.disable()
    return (time.process_time() - cpu) / (each * concurrency)


async def _child(redis_url: str, requests: int, concurrency: int) -> None:
    """Serve one measurement per line read on stdin, printing µs per request."""
    runtime = await _runtime(redis_url)
    loop = asyncio.get_running_loop()
    while (await loop.run_in_executor(None, sys.stdin.readline)).strip():
        per_request = await _measure(runtime.limiter, requests, concurrency, None)
        print(json.dumps(per_request * 1e6), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=32000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", type=int, default=0, help="print cProfile's top N")
    parser.add_argument("--sort", default="tottime", help="cProfile's order (cumtime...)")
    parser.add_argument("--baseline", type=Path, help="another source tree, interleaved")
    parser.add_argument("--redis-url", help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import uvloop

        uvloop.run(_child(args.redis_url, args.requests, args.concurrency))
        return

    with own_redis() as redis_url:
        child_args = [
            "--redis-url", redis_url,
            "--requests", str(args.requests),
            "--concurrency", str(args.concurrency),
        ]  # fmt: skip
        trees = trees_to_measure(ROOT, args.baseline)
        figures = measure_by_turns("loadtest.limiter_cost", child_args, trees, args.rounds)
        print_figures(figures, "µs per request")
        if args.profile:
            _profile(redis_url, args)


def _profile(redis_url: str, args: argparse.Namespace) -> None:
    async def run() -> None:
        runtime = await _runtime(redis_url)
        profile = cProfile.Profile(time.process_time)
        await _measure(runtime.limiter, args.requests, args.concurrency, profile)
        out = io.StringIO()
        stats = pstats.Stats(profile, stream=out)
        stats.sort_stats(args.sort).print_stats(args.profile)
        print(out.getvalue())

    import uvloop

    uvloop.run(run())


if __name__ == "__main__":
    main()
