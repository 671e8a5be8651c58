"""Redis that fails over: the gateway finds its primary through Redis Sentinel and
follows the promoted replica when the primary dies under traffic (issue 16).

Real processes: a primary, a replica, three sentinels, a Triton server and the gateway.
The figures (requests answered, admissions beyond the bound, how long the switch took)
are printed for docs/deployment.md; the assertions are the guarantees.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import aiohttp
from redis import Redis as SyncRedis

from gateway_tools.dev.processes import stop
from gateway_tools.dev.sim.server import TritonSim
from tests.e2e.stack import Gateway, model, start_gateway, tenant
from tests.e2e.test_rate_limits import chat
from tests.polling import wait_until
from tests.redis_sentinel import SERVICE, sentinel_group

RATE_PER_S = 10  # requests_per_minute 600
BURST = 20
TENANTS = {"metered": tenant("metered", ["*"], limits={"requests_per_minute": 60 * RATE_PER_S,
                                                       "burst_requests": BURST})}  # fmt: skip


def bucket_keys(port: int, prefix: str) -> list[bytes]:
    """The limiter's keys on the server at `port`, which must be a primary now."""
    with SyncRedis(port=port, socket_timeout=2) as server:
        assert server.info("replication")["role"] == "master"
        return list(server.scan_iter(f"{prefix}:*"))


def start(sims: tuple[TritonSim, TritonSim], nodes: list[str], prefix: str, tmp: Path) -> Gateway:
    settings = {
        "redis": {"url": "redis://127.0.0.1/0", "key_prefix": prefix,
                  "sentinel": {"service": SERVICE, "nodes": nodes}},
        "ratelimit": {"on_redis_error": "local", "redis_retry_s": 0.2},
    }  # fmt: skip
    models = {"llm-small": model("triton_grpc", [sims[0].grpc_target])}
    return start_gateway(tmp, models, "unused", tenants=TENANTS, gateway=settings)


async def test_the_gateway_follows_the_promoted_replica_and_answers_throughout(
    sims: tuple[TritonSim, TritonSim], tmp_path: Path
) -> None:
    prefix = f"sentinel-{time.time_ns()}"
    with sentinel_group(tmp_path) as group:
        gateway = start(sims, group.nodes, prefix, tmp_path / "gateway")
        try:
            statuses: Counter[int] = Counter()
            stop_load = asyncio.Event()
            async with aiohttp.ClientSession() as session:

                async def load() -> None:
                    while not stop_load.is_set():
                        status, _, _ = await chat(session, gateway, "metered")
                        statuses[status] += 1

                began = time.monotonic()
                workers = [asyncio.create_task(load()) for _ in range(4)]
                await asyncio.sleep(2.0)
                killed = time.monotonic()
                group.kill(group.primary)

                async def replica_promoted() -> bool:
                    return await asyncio.to_thread(group.primary_port) == group.replica

                async def limits_on_redis() -> bool:
                    return "Redis reachable again" in gateway.log

                await wait_until(replica_promoted, timeout_s=30)
                promoted = time.monotonic()
                await wait_until(limits_on_redis, timeout_s=30)
                back = time.monotonic()
                await asyncio.sleep(1.0)  # and on, on the new primary
                keys = await asyncio.to_thread(bucket_keys, group.replica, prefix)
                await asyncio.sleep(1.0)
                stop_load.set()
                await asyncio.gather(*workers)
                ended = time.monotonic()
        finally:
            stop(gateway.process)
    # Every request was answered under the fail mode: admitted or refused with 429.
    assert set(statuses) <= {200, 429}, statuses
    assert statuses[200] > 0 and statuses[429] > 0
    assert "Redis unreachable" in gateway.log
    # Back on Redis, the promoted replica, now primary, holds the tenant's bucket (a
    # bucket's key expires once it is full again: it is read while the load runs).
    assert keys
    # The bound: the bucket's burst and refill over the whole run, plus a margin of the
    # refill over the outage. What the local fallback admitted while Redis was gone is
    # charged to the promoted primary when it answers (LocalDebts), but the replica it
    # was may have missed the old primary's last writes before it died.
    outage = back - killed
    bound = BURST + RATE_PER_S * (ended - began) + RATE_PER_S * outage
    print(
        f"sentinel failover: {sum(statuses.values())} requests answered ({statuses[200]} "
        f"admitted, {statuses[429]} refused); promoted after {promoted - killed:.1f} s, "
        f"limits back on Redis after {outage:.1f} s; admitted beyond the exact bound "
        f"{statuses[200] - BURST - RATE_PER_S * (ended - began):.0f}"
    )
    assert statuses[200] <= bound + 1
