"""Everything a running gateway holds: config, routes, auth, Redis, health checks."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from redis.asyncio import RedisCluster
from redis.exceptions import RedisError

from gateway.admission import AdmissionController
from gateway.admission.queue import BATCH_API_CLASS
from gateway.apikeys import KeyDirectory, KeyStore
from gateway.backends.base import Backend
from gateway.backends.openai_compatible import OpenAIBackend
from gateway.backends.triton_grpc import TritonGRPCBackend
from gateway.backends.triton_http import TritonHTTPBackend
from gateway.backends.triton_metrics import default_metrics_url
from gateway.config import BackendKind, Config, ModelConfig, TenantsConfig, key_index
from gateway.config.loader import compile_pattern, is_pattern, pattern_rank
from gateway.config.schema import Price
from gateway.inference.prompt import PromptTemplate
from gateway.observability import metrics
from gateway.observability.access import UsageSink
from gateway.ratelimit.limiter import RateLimiter
from gateway.ratelimit.redis_store import RedisBuckets
from gateway.serving.attachment import Attachment, ServerView, cluster_attachment
from gateway.serving.auth import Authenticator
from gateway.serving.dispatch import Dispatcher
from gateway.serving.outbound import OutboundGuard
from gateway.serving.usage import UsageLedger, discounted, start_usage_ledger
from gateway.storage.idempotency_store import DEFAULT_IN_PROGRESS_TTL_S, IdempotencyStore
from gateway.storage.redis_client import (
    REDIS_ERRORS,
    RedisClient,
    connect_redis,
    eviction_policy,
)
from gateway.storage.response_store import ResponseStore
from gateway.upstream.discovery import ReplicaDiscovery
from gateway.upstream.health import HealthChecker
from gateway.upstream.outlier import ReplicaState
from gateway.upstream.pool import Replica, ReplicaPool
from gateway.upstream.route import ModelRoute, RouteResilience

log = logging.getLogger("gateway")


def _backend(model: ModelConfig) -> Backend:
    connect_s, total_s = model.timeouts.connect_s, model.timeouts.total_s
    if model.backend is BackendKind.TRITON_HTTP:
        return TritonHTTPBackend(connect_s, total_s, model.triton_interface)
    if model.backend is BackendKind.TRITON_GRPC:
        return TritonGRPCBackend(connect_s, total_s)
    api_key = model.api_key.get_secret_value() if model.api_key else None
    return OpenAIBackend(connect_s, total_s, api_key)


def _route(name: str, model: ModelConfig) -> ModelRoute:
    urls = [r.url.rstrip("/") for r in model.replicas]
    metrics_urls = [
        str(r.metrics_url) if r.metrics_url else default_metrics_url(model.backend, url)
        for r, url in zip(model.replicas, urls, strict=True)
    ]
    routing = model.routing
    pool = ReplicaPool(
        urls, metrics_urls, load_factor=routing.load_factor, ring_points=routing.ring_points
    )
    return ModelRoute(
        name=name,
        config=model,
        backend=_backend(model),
        pool=pool,
        template=PromptTemplate(model.prompt_template),
        resilience=RouteResilience.for_model(model, pool),
    )


def _capacity(route: ModelRoute, waits_for_replica: bool = False) -> Callable[[], int]:
    """Requests the model may have upstream at once: a share per replica in use.

    In use: healthy and in service with the outlier detector (`max_in_flight_per_replica`
    each, less other clients' requests queued there), or half-open (its one probe). An
    ejected replica counts for nothing. Never 0: with no replica in use (none healthy, or
    every healthy one ejected, when the detector sends everything to one of them),
    a replica's share, so requests go on to fail fast with a 503 (or to that one) rather
    than wait in the queue for their deadline; a replica busy with other clients'
    requests still takes one at a time.

    `waits_for_replica` (a model that may scale to zero): with no replica at all, 0, so
    that its requests queue for its first replica, which the closed loop places as soon
    as it sees them waiting (up to their deadline: then 503 `model_starting`).
    """
    per_replica = route.config.queue.max_in_flight_per_replica
    replicas = route.pool.replicas
    state = route.resilience.outlier.state

    def capacity() -> int:
        if waits_for_replica and not replicas:
            return 0
        total = 0
        in_use = False
        for replica in replicas:
            if not replica.healthy:
                continue
            match state(replica):
                case ReplicaState.IN_SERVICE:
                    in_use = True
                    # Other clients' requests queued on a replica (scraped from Triton)
                    # take its slots.
                    total += max(0, per_replica - replica.external)
                case ReplicaState.HALF_OPEN:
                    in_use = True
                    total += 1
        if not in_use:
            return per_replica
        return max(1, total)

    return capacity


def _follow_ejections(route: ModelRoute, admission: AdmissionController) -> None:
    """Recount the model's slots when the outlier detector ejects a replica or puts it
    back, and when a cool-down ends (the replica takes a probe again)."""
    outlier = route.resilience.outlier
    model = route.name

    def changed(replica: Replica) -> None:
        admission.capacity_changed(model)
        until = outlier.cooldown_end(replica)
        if until is None:
            log.warning(
                "replica back in service",
                extra={"fields": {"event": "readmission", "model": model,
                                  "replica": replica.url}},
            )  # fmt: skip
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not serving (a tool driving the detector by hand)
            return
        # One timer per ejection (rare); the detector's clock is time.monotonic.
        loop.call_later(max(0.0, until - time.monotonic()), admission.capacity_changed, model)

    outlier.on_change = changed


# Names whose pattern lookups are remembered, per tenant with patterns of its own and
# for all the others together; the oldest is forgotten past this.
ALIAS_CACHE_SIZE = 4096
# Longer names are matched every time, not remembered: a client sending huge random
# names must not fill the memory with them.
ALIAS_CACHE_MAX_NAME = 256

# Patterns in the order they are tried: the most specific first.
_Patterns = list[tuple[re.Pattern[str], str]]


def _ordered(aliases: list[tuple[str, str]]) -> tuple[dict[str, str], _Patterns]:
    """(alias, model) pairs as exact names and as patterns, most specific first (ties
    keep file order, which check-config makes matter only for names one model serves)."""
    exact = {alias: model for alias, model in aliases if not is_pattern(alias)}
    patterns = sorted(
        ((alias, model) for alias, model in aliases if is_pattern(alias)),
        key=lambda pair: pattern_rank(pair[0]),
        reverse=True,
    )
    return exact, [(compile_pattern(alias), model) for alias, model in patterns]


class Aliases:
    """The models' other names, exact or `*`/`?` patterns, per model and per tenant.

    A name resolves to the first of: the tenant's exact alias, the tenant's most
    specific matching pattern, a model's exact alias, a model's most specific matching
    pattern (model names themselves are looked up before, as routes). Exact lookups are
    dict lookups; a pattern search is remembered per name (bounded), misses included.
    """

    def __init__(self, models: Mapping[str, ModelConfig], tenants: TenantsConfig) -> None:
        self._exact, self._patterns = _ordered(
            [(alias, name) for name, model in models.items() for alias in model.aliases]
        )
        self._tenants = {
            name: _ordered(list(tenant.aliases.items()))
            for name, tenant in tenants.tenants.items()
            if tenant.aliases
        }
        self._cache: dict[tuple[str, str], str | None] = {}

    def resolve(self, tenant: str, name: str) -> str | None:
        """The model `name` stands for, for `tenant`; None if it is no alias."""
        own = self._tenants.get(tenant)
        if own is not None:
            model = own[0].get(name)
            if model is not None:
                return model
        model = self._exact.get(name)
        if own is None and model is not None:
            return model
        # Only tenants with patterns of their own need a cache line of their own.
        key = (tenant if own is not None else "", name)
        try:
            return self._cache[key]
        except KeyError:
            pass
        found = None
        if own is not None:
            found = _first_match(own[1], name)
        if found is None:
            found = model if model is not None else _first_match(self._patterns, name)
        if len(name) <= ALIAS_CACHE_MAX_NAME:
            if len(self._cache) >= ALIAS_CACHE_SIZE:
                del self._cache[next(iter(self._cache))]
            self._cache[key] = found
        return found


def _first_match(patterns: _Patterns, name: str) -> str | None:
    for pattern, model in patterns:
        if pattern.match(name):
            return model
    return None


@dataclass
class Runtime:
    config: Config
    routes: dict[str, ModelRoute]
    auth: Authenticator
    redis: RedisClient
    health: HealthChecker
    limiter: RateLimiter
    admission: AdmissionController
    dispatcher: Dispatcher
    idempotency: IdempotencyStore
    # Sanitizes what leaves for external models.
    outbound: OutboundGuard
    # The Responses API's stored responses.
    responses: ResponseStore
    # The control plane, when gateway.yaml names a cluster file: it places the models
    # deployed there and points their pools at the nodes that host them.
    placement: Attachment | None = None
    # Models whose replicas come from DNS (`discovery`), kept up to date.
    discovery: ReplicaDiscovery | None = None
    # The models' other names (`aliases`, and the tenants'), to the models' own.
    aliases: Aliases = field(
        default_factory=lambda: Aliases({}, TenantsConfig.model_construct(tenants={}))
    )
    # Every request's usage record, priced, when gateway.yaml has a `ledger:` (from
    # `start` on); and where each request's record goes when it is finished: the
    # ledger's `record`, handed to each record as it is made (a test may put its own).
    usage: UsageLedger | None = None
    record_sink: UsageSink | None = None
    # The managed keys (`/admin/keys`): the store in Redis, and what this gateway knows
    # of it, polled (`auth` looks keys up there after tenants.yaml's).
    key_store: KeyStore | None = None
    key_directory: KeyDirectory | None = None
    # The prices a Batch API line pays: `prices.models` at `prices.batch_discount`.
    batch_prices: dict[str, Price] = field(default_factory=dict)

    @classmethod
    def build(cls, config: Config) -> Runtime:
        """Wire the parts a config describes; nothing connects until `start`."""
        routes = {name: _route(name, model) for name, model in config.gateway.models.items()}
        redis = connect_redis(config.gateway)
        limiter = RateLimiter(
            RedisBuckets(redis, observe=metrics.observe_redis_round_trip),
            redis.ping,
            config.tenants,
            config.gateway.ratelimit,
            config.gateway.redis.key_prefix,
        )
        admission = AdmissionController([*config.gateway.admission.classes, BATCH_API_CLASS])
        placement = cluster_attachment(
            ServerView(config, routes, admission, redis, admission.capacity_changed)
        )
        to_zero = set() if placement is None else placement.scales_to_zero
        for route in routes.values():
            capacity = _capacity(route, waits_for_replica=route.name in to_zero)
            admission.configure_model(route.name, route.config.queue.max_queued, capacity)
            _follow_ejections(route, admission)
        discovery = ReplicaDiscovery(routes.values(), on_change=admission.capacity_changed)
        key_store = KeyStore(redis, config.gateway.redis.key_prefix)
        key_directory = KeyDirectory(key_store)
        return cls(
            config=config,
            routes=routes,
            aliases=Aliases(config.gateway.models, config.tenants),
            auth=Authenticator(config.tenants.tenants, config.tenant_by_key_hash, key_directory),
            redis=redis,
            health=HealthChecker(routes.values(), on_change=admission.capacity_changed),
            limiter=limiter,
            admission=admission,
            dispatcher=Dispatcher(admission),
            responses=ResponseStore(
                redis, config.gateway.redis.key_prefix, config.gateway.responses.ttl_s
            ),
            idempotency=IdempotencyStore(
                redis,
                config.gateway.redis.key_prefix,
                config.gateway.idempotency.ttl_s,
                # A run's "in progress" marker outlives the longest run it can be.
                in_progress_ttl_s=max(
                    [DEFAULT_IN_PROGRESS_TTL_S]
                    + [m.timeouts.total_s + 10.0 for m in config.gateway.models.values()]
                ),
            ),
            outbound=OutboundGuard(config),
            placement=placement,
            discovery=discovery,
            key_store=key_store,
            key_directory=key_directory,
            batch_prices=discounted(config.gateway.prices),
        )

    def apply_tenants(self, tenants: TenantsConfig) -> None:
        """Switch to reloaded tenants: keys, allowed models and limits at once."""
        index = key_index(tenants)
        self.config = self.config.model_copy(
            update={"tenants": tenants, "tenant_by_key_hash": index}
        )
        self.auth = Authenticator(tenants.tenants, index, self.key_directory)
        self.aliases = Aliases(self.config.gateway.models, tenants)
        self.limiter.update_tenants(tenants)
        metrics.set_config_version(self.config_version)

    @property
    def config_version(self) -> str:
        """A short digest of the loaded config (what it was loaded from, key hashes included)."""
        dump = self.config.model_dump_json(exclude={"gateway_path", "tenants_path"})
        return hashlib.sha256(dump.encode()).hexdigest()[:12]

    async def start(self) -> None:
        """Check every replica once, so readiness is known before traffic, then keep checking."""
        if isinstance(self.redis, RedisCluster):
            # Learn the slot map before traffic: redis-py's cluster client can fail a burst
            # of first commands on a client that has not initialised yet.
            try:
                await self.redis.initialize()
            except (RedisError, OSError) as exc:
                log.warning("Redis Cluster not reachable at start (%s)", exc)
        await self._check_eviction_policy()
        if self.key_directory is not None:
            await self.key_directory.start()
        if self.placement is not None:
            await self.placement.start()
        if self.discovery is not None:
            await self.discovery.start()
        ledger = self.config.gateway.ledger
        if ledger is not None:
            self.usage = await start_usage_ledger(ledger, self.config.gateway.prices)
            self.record_sink = self.usage.record
        await self.health.check_all()
        self.health.start()

    async def _check_eviction_policy(self) -> None:
        """Warn if Redis may evict keys when full (issue 40): one tenant's stored
        responses could then push out a managed key, a budget's spend or a bucket."""
        try:
            policy = await asyncio.wait_for(eviction_policy(self.redis), timeout=2.0)
        except TimeoutError:
            return
        if policy is not None and policy != "noeviction":
            log.warning(
                "Redis's maxmemory-policy is %s: when full it may evict managed keys, spend "
                "and rate-limit buckets; set it to noeviction (docs/deployment.md, "
                '"Redis memory")',
                policy,
            )

    async def close(self) -> None:
        if self.placement is not None:
            await self.placement.stop()
        if self.discovery is not None:
            await self.discovery.stop()
        await self.limiter.close()
        if self.usage is not None:
            await self.usage.close()  # after the requests: their records are in
        await self.health.stop()
        if self.key_directory is not None:
            await self.key_directory.stop()
        for route in self.routes.values():
            await route.backend.close()
        await self.redis.aclose()

    async def redis_ok(self) -> bool:
        try:
            return bool(await asyncio.wait_for(self.redis.ping(), timeout=1.0))
        except REDIS_ERRORS:
            return False
