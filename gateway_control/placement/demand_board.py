"""Every gateway's demand, shared through Redis for the placement leader.

Each gateway publishes, every `autoscaling.interval_s`, one report: per model, its
admission counters since it started (arrivals, completions, seconds of slots held), what
waits and runs now, and the p95 of its time to first token over the last interval; and,
per priority class, the tokens its requests reserved and what of it waits and runs (a
report without them, from an earlier version, is counted in requests, all online). The
report is one key, `{prefix}:{placement}:demand:<gateway id>`, that expires after
`stale_after_s` by Redis's clock (no gateway's clock decides what is stale), and its id
goes into the set `{prefix}:{placement}:demand_gateways`. All share one hash tag: one
Redis Cluster slot.

The leader reads every report (`read`); `DemandTracker` turns two reads of one gateway
into rates (the differences of its counters over the difference of its own monotonic
clock, so clock skew between gateways does not matter) and sums the gateways per model.
A model that no gateway reported freshly is missing: the planner holds it.

Demand is work, not a count of requests: each request counts by the tokens it reserved
(its `cost_tokens`, `max_tokens` included; each of `n` choices is a request of its own)
against the mean of the requests that finished, so that arrival rate x service time is
the slot-seconds a second that arrived. A burst of small requests weighs what it costs.
The part of it in `batch_classes` is told apart (`Demand.online` is the rest): it keeps
replicas but adds none to an online model (`replica_planner`).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace

import orjson

from gateway.admission.queue import BATCH_API_CLASS
from gateway.storage.redis_client import RedisClient
from gateway_control.placement.queueing_model import Demand

TAG = "{placement}"


@dataclass(frozen=True, slots=True)
class ClassReport:
    """One priority class of one model as one gateway saw it: requests and the tokens
    they reserved since the gateway started; requests and their tokens waiting now, and
    requests running now."""

    arrivals: int
    tokens: int
    queued: int
    queued_tokens: int
    in_flight: int

    def to_json(self) -> list[int]:
        return [self.arrivals, self.tokens, self.queued, self.queued_tokens, self.in_flight]

    @classmethod
    def from_json(cls, data: list[object]) -> ClassReport:
        arrivals, tokens, queued, queued_tokens, in_flight = data
        return cls(
            _count(arrivals), _count(tokens), _count(queued), _count(queued_tokens),
            _count(in_flight),
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class ModelReport:
    """One model as one gateway saw it: counters since the gateway started, and now;
    by priority class, what its demand weighs (`classes`; empty from an earlier
    version), with the tokens the released slots had reserved (`completed_tokens`)."""

    arrivals: int
    completions: int
    busy_s: float
    queued: int
    in_flight: int
    ttft_p95_s: float | None = None
    completed_tokens: int = 0
    classes: Mapping[str, ClassReport] = field(default_factory=dict)

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
        # The classes apart from `models`: a leader of an earlier version reads the rest.
        body = orjson.dumps({
            "at": report.at,
            "models": {name: m.to_json() for name, m in report.models.items()},
            "work": {
                name: [m.completed_tokens, {c: r.to_json() for c, r in m.classes.items()}]
                for name, m in report.models.items()
                if m.classes
            },
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


@dataclass(slots=True)
class _Part:
    """Online or batch demand of one model, summed over the gateways as it is read."""

    rate: float = 0.0  # requests a second, unweighted (reports without classes)
    token_rate: float = 0.0  # tokens reserved a second
    count_rate: float = 0.0  # requests a second with those tokens
    queued: float = 0.0  # requests waiting, unweighted
    queued_tokens: int = 0
    queued_counted: int = 0  # requests waiting with those tokens
    in_flight: int = 0

    def demand(self, mean_tokens: float | None, service_s: float, ttft: float | None) -> Demand:
        """In requests of the mean cost (`mean_tokens`; None: counted as they are)."""
        if mean_tokens:
            rate = self.rate + self.token_rate / mean_tokens
            queued = self.queued + self.queued_tokens / mean_tokens
        else:
            rate = self.rate + self.count_rate
            queued = self.queued + self.queued_counted
        return Demand(rate, service_s, queued, self.in_flight, ttft)


@dataclass(slots=True)
class _Sums:
    """One model's demand over every gateway, as it is read."""

    online: _Part = field(default_factory=_Part)
    batch: _Part = field(default_factory=_Part)
    weighed: bool = False  # some gateway reported its classes
    done: int = 0
    busy_s: float = 0.0
    done_counted: int = 0  # completions from reports with classes
    done_tokens: int = 0  # the tokens they had reserved
    ttft: float | None = None


class DemandTracker:
    """Per model, the demand of every gateway summed, from successive reads; requests
    weighed by the tokens they reserved, and those of `batch_classes` told apart (the
    Batch APIs' own class, `batch-api`, always: it keeps replicas, never adds one)."""

    def __init__(self, batch_classes: Collection[str] = ()) -> None:
        self._last: dict[str, GatewayReport] = {}
        self._batch = frozenset(batch_classes) | {BATCH_API_CLASS}
        # Per model, the mean tokens a finished request had reserved, as last measured.
        self._mean_tokens: dict[str, float] = {}

    def update(self, reports: Iterable[GatewayReport]) -> dict[str, Demand]:
        """The demand per model over the interval since each gateway's previous report
        (a gateway seen for the first time counts from its next report on; its queued
        and running requests count at once)."""
        sums: dict[str, _Sums] = {}
        seen = set()
        for report in reports:
            seen.add(report.gateway)
            before = self._last.get(report.gateway)
            elapsed = 0.0 if before is None else report.at - before.at
            for model, now in report.models.items():
                then = None if before is None else before.models.get(model)
                fresh = then is not None and elapsed > 0 and now.arrivals >= then.arrivals
                self._add(sums.setdefault(model, _Sums()), now, then if fresh else None, elapsed)
            self._last[report.gateway] = report
        for gateway in set(self._last) - seen:
            del self._last[gateway]
        return {model: self._demand(model, found) for model, found in sums.items()}

    def _add(self, sums: _Sums, now: ModelReport, then: ModelReport | None, elapsed: float) -> None:
        """One gateway's report of a model (`then`: its previous one, None when there is
        none to count from: new, the same report again, or counters that restarted)."""
        if now.ttft_p95_s is not None:
            sums.ttft = max(sums.ttft or 0.0, now.ttft_p95_s)
        if not now.classes:  # an earlier version's report: requests, all online
            sums.online.queued += now.queued
            sums.online.in_flight += now.in_flight
        for name, seen in now.classes.items():
            part = sums.batch if name in self._batch else sums.online
            part.queued_tokens += seen.queued_tokens
            part.queued_counted += seen.queued
            part.in_flight += seen.in_flight
            sums.weighed = True
        if then is None:
            return
        sums.done += now.completions - then.completions
        sums.busy_s += now.busy_s - then.busy_s
        if not (now.classes and then.classes):
            sums.online.rate += (now.arrivals - then.arrivals) / elapsed
            return
        sums.done_counted += now.completions - then.completions
        sums.done_tokens += now.completed_tokens - then.completed_tokens
        for name, seen in now.classes.items():
            part = sums.batch if name in self._batch else sums.online
            was = then.classes.get(name, ClassReport(0, 0, 0, 0, 0))
            if seen.tokens >= was.tokens and seen.arrivals >= was.arrivals:
                part.token_rate += (seen.tokens - was.tokens) / elapsed
                part.count_rate += (seen.arrivals - was.arrivals) / elapsed

    def _demand(self, model: str, sums: _Sums) -> Demand:
        service_s = sums.busy_s / sums.done if sums.done > 0 else 0.0
        if sums.done_counted > 0 and sums.done_tokens > 0:
            self._mean_tokens[model] = sums.done_tokens / sums.done_counted
        mean = self._mean_tokens.get(model)
        if mean is None:  # nothing finished yet: the mean of what arrived, if anything did
            counted = sums.online.count_rate + sums.batch.count_rate
            tokens = sums.online.token_rate + sums.batch.token_rate
            mean = tokens / counted if counted > 0 and tokens > 0 else None
        online = sums.online.demand(mean, service_s, sums.ttft)
        batch = sums.batch.demand(mean, service_s, sums.ttft)
        return Demand(
            arrival_rate=online.arrival_rate + batch.arrival_rate,
            service_s=service_s,
            queued=online.queued + batch.queued,
            in_flight=online.in_flight + batch.in_flight,
            ttft_p95_s=sums.ttft,
            online=online if sums.weighed else None,
        )


def _parsed(gateway: str, value: bytes | str) -> GatewayReport | None:
    try:
        data = orjson.loads(value)
        models = {str(name): ModelReport.from_json(m) for name, m in data["models"].items()}
        draining = {
            str(model): {str(url): _count(n) for url, n in urls.items()}
            for model, urls in data.get("draining", {}).items()
        }
        for name, (completed_tokens, classes) in data.get("work", {}).items():
            models[str(name)] = replace(
                models[str(name)],
                completed_tokens=_count(completed_tokens),
                classes={str(c): ClassReport.from_json(r) for c, r in classes.items()},
            )
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
