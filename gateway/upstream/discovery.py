"""Replicas from DNS: a model's replica set kept up to date from its DNS records.

In Kubernetes, a headless Service (`clusterIP: None`) has one A record per ready pod, and
one SRV record per pod and named port. A model configured with `discovery` is looked up
every `interval_s` (dnspython's resolver); when the answer differs, the model's pool gets
the new set (`ReplicaPool.set_urls`). A replica that leaves the set serves the requests
it already has to their end: they hold it, the pool only stops choosing it. A replica
that joins is health-checked like the others.

A failed lookup (timeout, SERVFAIL, no records) keeps the set as it is: a DNS hiccup, or
every pod restarting at once, must not empty a model's replicas. It is logged and counted
(`gateway_discovery_lookups_total{result}`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import dns.asyncresolver
import dns.exception
import dns.nameserver
import dns.resolver

from gateway.backends.triton_metrics import default_metrics_url
from gateway.config.schema import BackendKind, Discovery
from gateway.observability import metrics
from gateway.upstream.route import ModelRoute

log = logging.getLogger("gateway.discovery")

_LOOKUP_ERRORS = (dns.exception.DNSException, OSError)


@dataclass(frozen=True, slots=True, order=True)
class Endpoint:
    """One address a model's replica answers on."""

    host: str
    port: int


def replica_url(backend: BackendKind, endpoint: Endpoint, scheme: str) -> str:
    """The replica URL the backend takes: `host:port` for gRPC, else a base URL."""
    host = f"[{endpoint.host}]" if ":" in endpoint.host else endpoint.host
    if backend is BackendKind.TRITON_GRPC:
        return f"{host}:{endpoint.port}"
    return f"{scheme}://{host}:{endpoint.port}"


def resolver_for(settings: Discovery) -> dns.asyncresolver.Resolver:
    """A resolver asking the configured nameservers, or the system's."""
    if not settings.nameservers:
        return dns.asyncresolver.Resolver()
    resolver = dns.asyncresolver.Resolver(configure=False)
    servers: list[dns.nameserver.Nameserver | str] = []
    for server in settings.nameservers:
        host, _, port = server.rpartition(":") if server.count(":") == 1 else (server, "", "")
        servers.append(dns.nameserver.Do53Nameserver(host or server, int(port or 53)))
    resolver.nameservers = servers
    return resolver


async def lookup(resolver: dns.asyncresolver.Resolver, settings: Discovery) -> list[Endpoint]:
    """The endpoints the records name now, sorted; DNSException when there are none."""
    timeout = settings.timeout_s
    if settings.record == "A":
        assert settings.port is not None  # the schema requires it with A records
        answer = await resolver.resolve(settings.dns, "A", lifetime=timeout)
        return sorted({Endpoint(record.address, settings.port) for record in answer})
    answer = await resolver.resolve(settings.dns, "SRV", lifetime=timeout)
    endpoints: set[Endpoint] = set()
    for record in answer:
        target = record.target.to_text().rstrip(".")
        addresses = await resolver.resolve(target, "A", lifetime=timeout)
        endpoints.update(Endpoint(a.address, record.port) for a in addresses)
    return sorted(endpoints)


class ReplicaDiscovery:
    """Keeps the pools of the models configured with `discovery` up to date."""

    def __init__(
        self, routes: Iterable[ModelRoute], on_change: Callable[[str], None] | None = None
    ) -> None:
        self._routes = [route for route in routes if route.config.discovery is not None]
        self._resolvers = {
            route.name: resolver_for(route.config.discovery)  # type: ignore[arg-type]
            for route in self._routes
        }
        self._on_change = on_change
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def models(self) -> Sequence[str]:
        return [route.name for route in self._routes]

    async def refresh(self, route: ModelRoute) -> bool:
        """Look the model's records up once; True when its replica set changed."""
        settings = route.config.discovery
        assert settings is not None
        try:
            endpoints = await lookup(self._resolvers[route.name], settings)
        except _LOOKUP_ERRORS as exc:
            metrics.DISCOVERY_LOOKUPS.labels(route.name, "failed").inc()
            log.warning(
                "%s: DNS lookup of %s (%s) failed, keeping %d replica(s): %s",
                route.name, settings.dns, settings.record, len(route.pool.replicas),
                type(exc).__name__,
            )  # fmt: skip
            return False
        metrics.DISCOVERY_LOOKUPS.labels(route.name, "ok").inc()
        backend = route.config.backend
        urls = [replica_url(backend, e, settings.scheme) for e in endpoints]
        current = [replica.url for replica in route.pool.replicas]
        if urls == current:
            return False
        route.pool.set_urls(urls, [default_metrics_url(backend, url) for url in urls])
        log.warning(
            "%s: replicas from DNS %s: %s (were %s)",
            route.name, settings.dns, ", ".join(urls) or "none", ", ".join(current) or "none",
            extra={"fields": {"event": "replicas_discovered", "model": route.name,
                              "replicas": urls}},
        )  # fmt: skip
        if self._on_change is not None:
            self._on_change(route.name)
        return True

    async def start(self) -> None:
        """Look every model up once (so readiness knows its replicas), then keep looking."""
        await asyncio.gather(*(self.refresh(route) for route in self._routes))
        self._tasks = [asyncio.create_task(self._follow(route)) for route in self._routes]

    async def _follow(self, route: ModelRoute) -> None:
        assert route.config.discovery is not None
        while True:
            await asyncio.sleep(route.config.discovery.interval_s)
            await self.refresh(route)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
