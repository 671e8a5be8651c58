"""Whether this gateway instance should get traffic, and the state of what it depends on.

A load balancer pulls an instance that answers 503 on `/readyz`. That must happen only
when this instance cannot serve while another could, never for a state every instance
shares and serves through: Redis down is not a reason when the fail mode (`local`,
`open`) keeps serving, and neither is one model without a healthy replica (the other
models still answer, and the model's requests get a fast 503 with Retry-After).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gateway.config import RedisFailureMode
from gateway.serving.runtime import Runtime

Status = Literal["ok", "degraded", "unavailable"]


@dataclass(frozen=True, slots=True)
class ModelState:
    """One model's replicas: how many are configured or placed, and how many are healthy."""

    replicas: int
    healthy: int

    @property
    def ready(self) -> bool:
        return self.healthy > 0


@dataclass(frozen=True, slots=True)
class Readiness:
    """This instance's readiness and the state of each dependency."""

    redis_up: bool
    on_redis_error: RedisFailureMode
    models: dict[str, ModelState]

    @property
    def ready(self) -> bool:
        """Serving: Redis answers, or its fail mode admits without it."""
        return self.redis_up or self.on_redis_error is not RedisFailureMode.CLOSED

    @property
    def status(self) -> Status:
        if not self.ready:
            return "unavailable"
        if self.redis_up and all(m.ready for m in self.models.values()):
            return "ok"
        return "degraded"

    def body(self) -> dict[str, object]:
        """The JSON body of `/readyz`."""
        return {
            "ready": self.ready,
            "status": self.status,
            "redis": {"up": self.redis_up, "on_error": self.on_redis_error.value},
            "models": {
                name: {"ready": m.ready, "replicas": m.replicas, "healthy": m.healthy}
                for name, m in self.models.items()
            },
        }


async def readiness(runtime: Runtime) -> Readiness:
    """The instance's readiness now (one Redis PING, at most a second)."""
    return Readiness(
        redis_up=await runtime.redis_ok(),
        on_redis_error=runtime.config.gateway.ratelimit.on_redis_error,
        models={
            name: ModelState(len(route.pool.replicas), sum(r.healthy for r in route.pool.replicas))
            for name, route in runtime.routes.items()
        },
    )
