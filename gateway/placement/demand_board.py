"""Every gateway's demand, shared through Redis for the placement leader.

Each gateway publishes, every `autoscaling.interval_s`, one report: per model, its
admission counters since it started (arrivals, completions, seconds of slots held), what
waits and runs now, and the p95 of its time to first token over the last interval. The
report is one key, `{prefix}:{placement}:demand:<gateway id>`, that expires after
`stale_after_s` by Redis's clock (no gateway's clock decides what is stale), and its id
goes into the set `{prefix}:{placement}:demand_gateways`. All share one hash tag: one
Redis Cluster slot.

The leader reads every report (`read`); `DemandTracker` turns two reads of one gateway
into rates (the differences of its counters over the difference of its own monotonic
clock, so clock skew between gateways does not matter) and sums the gateways per model.
A model that no gateway reported freshly is missing: the planner holds it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import orjson

from gateway.placement.queueing_model import Demand
from gateway.storage.redis_client import RedisClient

TAG = "{placement}"


@dataclass(frozen=True, slots=True)
class ModelReport:
    """One model as one gateway saw it: counters since the gateway started, and now."""

    arrivals: int
    completions: int
    busy_s: float
    queued: int
    in_flight: int
    ttft_p95_s: float | None = None

    def to_json(self) -> list[float | int | None]:
        return [
            self.arrivals, self.completions, self.busy_s, self.queued, self.in_flight,
            self.ttft_p95_s,
        ]  # fmt: skip

    @classmethod
    def from_json(cls, data: list[object]) -> ModelReport:
        arrivals, completions, busy_s, queued, in_flight, ttft = data
        return cls(
            _count(arrivals), _count(completions), _seconds(busy_s), _count(queued),
            _count(in_flight), None if ttft is None else _seconds(ttft),
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class GatewayReport:
    """One gateway's report: when (its own monotonic clock) and its models; and, for a
    move's drain, the placement it serves from (`placement_digest`) and its requests
    still on replicas that placement took out (model -> replica URL -> requests)."""

    gateway: str
    at: float
    models: Mapping[str, ModelReport]
    plan: str = ""
    draining: Mapping[str, Mapping[str, int]] = field(default_factory=dict)


class DemandBoard:
    """The reports in Redis: each gateway publishes its own, the leader reads them all."""

    def __init__(self, redis: RedisClient, prefix: str, stale_after_s: float) -> None:
        self._redis = redis
        self._prefix = f"{prefix}:{TAG}"
        self.gateways_key = f"{self._prefix}:demand_gateways"
        self._ttl_ms = max(1, round(stale_after_s * 1000))

    def _key(self, gateway: str) -> str:
        return f"{self._prefix}:demand:{gateway}"

    async def publish(self, report: GatewayReport) -> None:
        """This gateway's report, fresh for `stale_after_s`."""
        body = orjson.dumps({
            "at": report.at,
            "models": {name: m.to_json() for name, m in report.models.items()},
            "plan": report.plan,
            "draining": report.draining,
        })  # fmt: skip
        pipe = self._redis.pipeline(transaction=False)
        pipe.set(self._key(report.gateway), body, px=self._ttl_ms)
        pipe.sadd(self.gateways_key, report.gateway)
        await pipe.execute()

    async def read(self) -> list[GatewayReport]:
        """Every fresh report; the ids of gateways whose report expired are forgotten."""
        members = await self._redis.smembers(self.gateways_key)
        gateways = sorted(m.decode() if isinstance(m, bytes) else str(m) for m in members)
        if not gateways:
            return []
        values = await self._redis.mget([self._key(g) for g in gateways])
        reports, gone = [], []
        for gateway, value in zip(gateways, values, strict=True):
            report = None if value is None else _parsed(gateway, value)
            if report is None:
                gone.append(gateway)
            else:
                reports.append(report)
        if gone:
            await self._redis.srem(self.gateways_key, *gone)
        return reports


class DemandTracker:
    """Per model, the demand of every gateway summed, from successive reads."""

    def __init__(self) -> None:
        self._last: dict[str, GatewayReport] = {}

    def update(self, reports: Iterable[GatewayReport]) -> dict[str, Demand]:
        """The demand per model over the interval since each gateway's previous report
        (a gateway seen for the first time counts from its next report on; its queued
        and running requests count at once)."""
        rates: dict[str, float] = {}
        busy: dict[str, float] = {}
        done: dict[str, int] = {}
        queued: dict[str, int] = {}
        running: dict[str, int] = {}
        ttft: dict[str, float] = {}
        seen = set()
        for report in reports:
            seen.add(report.gateway)
            before = self._last.get(report.gateway)
            elapsed = 0.0 if before is None else report.at - before.at
            for model, now in report.models.items():
                queued[model] = queued.get(model, 0) + now.queued
                running[model] = running.get(model, 0) + now.in_flight
                rates.setdefault(model, 0.0)
                if now.ttft_p95_s is not None:
                    ttft[model] = max(ttft.get(model, 0.0), now.ttft_p95_s)
                then = None if before is None else before.models.get(model)
                if then is None or elapsed <= 0 or now.arrivals < then.arrivals:
                    continue  # new, the same report again, or counters that restarted
                rates[model] += (now.arrivals - then.arrivals) / elapsed
                done[model] = done.get(model, 0) + now.completions - then.completions
                busy[model] = busy.get(model, 0.0) + now.busy_s - then.busy_s
            self._last[report.gateway] = report
        for gateway in set(self._last) - seen:
            del self._last[gateway]
        return {
            model: Demand(
                arrival_rate=rate,
                service_s=busy.get(model, 0.0) / done[model] if done.get(model) else 0.0,
                queued=queued[model],
                in_flight=running[model],
                ttft_p95_s=ttft.get(model),
            )
            for model, rate in rates.items()
        }


def _parsed(gateway: str, value: bytes | str) -> GatewayReport | None:
    try:
        data = orjson.loads(value)
        models = {str(name): ModelReport.from_json(m) for name, m in data["models"].items()}
        draining = {
            str(model): {str(url): _count(n) for url, n in urls.items()}
            for model, urls in data.get("draining", {}).items()
        }
        plan = str(data.get("plan", ""))
        return GatewayReport(gateway, _seconds(data["at"]), models, plan, draining)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        return None  # a report this version cannot read is no report


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"not a count: {value!r}")
    return value


def _seconds(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"not seconds: {value!r}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"not seconds: {value!r}")
    return seconds
