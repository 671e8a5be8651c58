"""A redis-server of a test's own (paused, killed, started again) and a rate limiter on
it, for the limiter's tests (`test_limiter.py`, `test_outage.py`)."""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from gateway.config import RateLimitConfig, TenantsConfig
from gateway.ratelimit.limiter import RateLimiter
from gateway.ratelimit.redis_store import RedisBuckets
from gateway_tools.dev.processes import start_redis, stop

PREFIX = "limiter-test"
KEY_HASH = "sha256:" + "0" * 64


def tenants(**limits: Any) -> TenantsConfig:
    shadow = limits.pop("shadow", False)
    return TenantsConfig.model_validate(
        {"tenants": {"t": {"api_keys": [KEY_HASH], "limits": limits, "shadow": shadow}}}
    )


@dataclass
class OwnRedis:
    process: subprocess.Popen[bytes]
    url: str

    def pause(self) -> None:
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)

    def kill(self) -> None:
        stop(self.process)

    def start_again(self) -> None:
        """A new redis-server on the same port: empty, every bucket full."""
        self.process = start_redis(int(self.url.rsplit(":", 1)[1].split("/")[0]))


def make_limiter(url: str, tenants_config: TenantsConfig, **config: Any) -> RateLimiter:
    redis = Redis.from_url(url, socket_timeout=0.3, socket_connect_timeout=0.3)
    return RateLimiter(
        RedisBuckets(redis),
        redis.ping,
        tenants_config,
        RateLimitConfig(redis_retry_s=0.1, **config),
        PREFIX,
    )
