"""Discovered replicas: a model's replica set kept up to date from DNS or from the
Kubernetes API.

In Kubernetes, a headless Service (`clusterIP: None`) has one A record per ready pod, and
one SRV record per pod and named port; any Service has EndpointSlices that list its
endpoints and whether each is ready. A model configured with `discovery` is looked up
every `interval_s` (dnspython's resolver, or the EndpointSlices through
kubernetes_asyncio); when the answer differs, the model's pool gets the new set
(`ReplicaPool.set_urls`). A replica that leaves the set serves the requests
it already has to their end: they hold it, the pool only stops choosing it. A replica
that joins is health-checked like the others.

A failed lookup (timeout, SERVFAIL, no records, no ready endpoint, the API unreachable)
keeps the set as it is: a DNS hiccup, or every pod restarting at once, must not empty a
model's replicas. It is logged and counted
(`gateway_discovery_lookups_total{result}`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable

import dns.asyncresolver
import dns.exception
import dns.nameserver
import dns.resolver

from gateway.backends.triton_metrics import default_metrics_url
from gateway.config.schema import BackendKind, Discovery
from gateway.observability import metrics
from gateway.upstream.replica_endpoints import Endpoint, EndpointSource, LookupFailed
from gateway.upstream.route import ModelRoute

log = logging.getLogger("gateway.discovery")

_LOOKUP_ERRORS = (dns.exception.DNSException, OSError)


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


class DnsSource:
    """A or SRV records, through dnspython."""

    def __init__(self, settings: Discovery) -> None:
        self._settings = settings
        self._resolver = resolver_for(settings)

    async def endpoints(self) -> list[Endpoint]:
        try:
            return await lookup(self._resolver, self._settings)
        except _LOOKUP_ERRORS as exc:
            raise LookupFailed(type(exc).__name__) from exc

    async def close(self) -> None:
        pass


def source_for(settings: Discovery) -> EndpointSource:
    """The source a model's `discovery` names."""
    if settings.kubernetes is not None:
        # Only now: the Kubernetes client costs a server that does not use it 0.2 s
        # of start and its memory.
        from gateway.upstream.endpoint_slices import EndpointSliceSource

        return EndpointSliceSource(settings.kubernetes, settings.timeout_s)
    return DnsSource(settings)


async def lookup(resolver: dns.asyncresolver.Resolver, settings: Discovery) -> list[Endpoint]:
    """The endpoints the records name now, sorted; DNSException when there are none."""
    assert settings.dns is not None
    timeout = settings.timeout_s
    if settings.record == "A":
        assert settings.port is not None  # the schema requires it with A records
        answer = await resolver.resolve(settings.dns, "A", lifetime=timeout)
        return sorted({Endpoint(record.address, settings.port) for record in answer})
    answer = await resolver.resolve(settings.dns, "SRV", lifetime=timeout)
    endpoints: set[Endpoint] = set()
    for record in answer:
        # One target that does not resolve (a pod going away) leaves the others.
        try:
            addresses = await resolver.resolve(record.target, "A", lifetime=timeout)
        except _LOOKUP_ERRORS:
            continue
        endpoints.update(Endpoint(a.address, record.port) for a in addresses)
    if not endpoints:
        raise dns.exception.DNSException(f"no target of {settings.dns} resolves")  # type: ignore[no-untyped-call]
    return sorted(endpoints)


class ReplicaDiscovery:
    """Keeps the pools of the models configured with `discovery` up to date."""

    def __init__(
        self, routes: Iterable[ModelRoute], on_change: Callable[[str], None] | None = None
    ) -> None:
        self._routes = [route for route in routes if route.config.discovery is not None]
        self._sources = {
            route.name: source_for(route.config.discovery)  # type: ignore[arg-type]
            for route in self._routes
        }
        self._on_change = on_change
        self._tasks: list[asyncio.Task[None]] = []

    async def refresh(self, route: ModelRoute) -> bool:
        """Look the model's records up once; True when its replica set changed."""
        settings = route.config.discovery
        assert settings is not None
        try:
            endpoints = await self._sources[route.name].endpoints()
        except LookupFailed as exc:
            metrics.DISCOVERY_LOOKUPS.labels(route.name, "failed").inc()
            log.warning(
                "%s: looking up %s failed, keeping %d replica(s): %s",
                route.name, _named(settings), len(route.pool.replicas), exc,
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
            "%s: replicas from %s: %s (were %s)",
            route.name, _named(settings), ", ".join(urls) or "none", ", ".join(current) or "none",
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
            try:
                await self.refresh(route)
            except Exception:  # discovery must go on
                log.exception("%s: looking up its replicas failed", route.name)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        for source in self._sources.values():
            await source.close()


def _named(settings: Discovery) -> str:
    """What was looked up, for the log: `DNS <name>` or `EndpointSlices of <Service>`."""
    if settings.kubernetes is not None:
        return f"EndpointSlices of {settings.kubernetes.service}"
    return f"DNS {settings.dns}"
