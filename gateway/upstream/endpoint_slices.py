"""A model's replicas from a Service's EndpointSlices, through the Kubernetes API
(kubernetes_asyncio), imported only by a server whose models are found there."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import aiohttp
from kubernetes_asyncio.client import ApiClient, DiscoveryV1Api
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config import ConfigException

from gateway.config.schema import KubernetesEndpoints
from gateway.upstream.kubernetes_api import api_client, pod_namespace
from gateway.upstream.replica_endpoints import Endpoint, LookupFailed


class EndpointSliceSource:
    """The ready endpoints of a Service's EndpointSlices, through the Kubernetes API."""

    def __init__(self, settings: KubernetesEndpoints, timeout_s: float) -> None:
        self._settings = settings
        self._namespace = pod_namespace(settings.namespace)
        self._timeout_s = timeout_s
        self._client: ApiClient | None = None

    async def endpoints(self) -> list[Endpoint]:
        try:
            if self._client is None:
                self._client = await api_client(self._settings.kubeconfig)
            slices = await DiscoveryV1Api(self._client).list_namespaced_endpoint_slice(
                self._namespace,
                label_selector=f"kubernetes.io/service-name={self._settings.service}",
                _request_timeout=self._timeout_s,
            )
        except (ApiException, ConfigException, aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise LookupFailed(f"{type(exc).__name__}: {exc}"[:200]) from exc
        found = sorted(set(ready_endpoints(slices.items, self._settings.port)))
        if not found:
            raise LookupFailed(f"no ready endpoint of Service {self._settings.service}")
        return found

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None


def ready_endpoints(slices: Iterable[Any], port: str | int) -> Iterable[Endpoint]:
    """The addresses of each slice's ready endpoints, on the slice's port named (or
    numbered) `port`. An endpoint whose `ready` condition is unset counts as ready, as
    the API documents; a terminating one does not."""
    for piece in slices:
        numbers = [
            p.port for p in piece.ports or ()
            if p.port is not None and (p.name == port or p.port == port)
        ]  # fmt: skip
        if not numbers:
            continue
        for endpoint in piece.endpoints or ():
            conditions = endpoint.conditions
            if conditions is not None and conditions.ready is False:
                continue
            for address in endpoint.addresses or ():
                yield Endpoint(address, numbers[0])
