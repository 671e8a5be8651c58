"""The placement lease as a Kubernetes `Lease` object (coordination.k8s.io/v1).

The same promise as the Redis lease (gateway_control.placement.leadership), kept the way
client-go's leader election keeps it:

- a gateway takes the Lease when it does not exist, was released (no holder), or has not
  changed for `leaseDurationSeconds` as this gateway observed it (its own clock, so that
  clocks that disagree do not matter); the holder renews it every third of that;
- every write carries the `resourceVersion` it read: of two gateways writing at once, the
  API server accepts one and answers the other 409, which then does not hold the lease;
- the fencing token is `leaseTransitions + 1`, which every change of holder increments.
  Before each repository call the leader reads the Lease again: another holder, or
  another count of transitions, and it stops.

It needs a Role that may get, create and update `leases` in its namespace
(deploy/kubernetes/components/kubernetes-api-access). The placement itself is still
published in Redis, which every gateway has.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config import ConfigException

from gateway.config.schema import PlacementConfig
from gateway.upstream.kubernetes_api import api_client, pod_namespace
from gateway_control.placement.leadership import (
    LeaseKeys,
    LeaseUnavailable,
    LostLeadership,
    holder_id,
)

# ConfigException: no kubeconfig, or no service-account token in the pod.
_UNREACHABLE = (ApiException, ConfigException, aiohttp.ClientError, OSError, TimeoutError)


def _now() -> datetime.datetime:
    now = datetime.datetime.now(datetime.UTC)
    # isoformat() drops a zero fraction, and the API server's MicroTime wants one.
    return now.replace(microsecond=now.microsecond or 1)


class KubernetesLease:
    """This gateway's side of the placement Lease."""

    def __init__(self, settings: PlacementConfig, prefix: str, holder: str = "") -> None:
        self.keys = LeaseKeys.for_prefix(prefix)
        self.holder = holder or holder_id()
        self.ttl_ms = max(1000, round(settings.lease_ttl_s * 1000))
        self.token = 0
        self._duration_s = max(1, round(settings.lease_ttl_s))
        # Each API call within a third of the lease: a hung connection must not keep a
        # leader that can no longer renew believing it leads.
        self._timeout_s = max(0.5, settings.lease_ttl_s / 3)
        self._name = settings.lease_name
        self._namespace = pod_namespace(settings.lease_namespace)
        self._kubeconfig = settings.kubeconfig
        self._api: client.CoordinationV1Api | None = None
        self._api_client: client.ApiClient | None = None
        # The Lease as last read, and when (monotonic) it was last seen to change.
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0

    @property
    def held(self) -> bool:
        return self.token > 0

    async def _coordination(self) -> client.CoordinationV1Api:
        if self._api is None:
            self._api_client = await api_client(self._kubeconfig)
            self._api = client.CoordinationV1Api(self._api_client)
        return self._api

    async def campaign(self) -> int:
        """Take the Lease if it is free or expired, renew it if it is ours; the token, or 0."""
        try:
            self.token = await self._campaign()
        except _UNREACHABLE as exc:
            self.token = 0
            raise LeaseUnavailable(f"the Kubernetes API: {_reason(exc)}") from exc
        return self.token

    async def _campaign(self) -> int:
        api = await self._coordination()
        try:
            lease = await api.read_namespaced_lease(
                self._name, self._namespace, _request_timeout=self._timeout_s
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            return await self._create(api)
        spec = lease.spec
        record = (spec.holder_identity, spec.renew_time, spec.lease_transitions)
        if record != self._observed:
            self._observed, self._observed_at = record, time.monotonic()
        transitions = spec.lease_transitions or 0
        if spec.holder_identity == self.holder:
            return await self._write(api, lease, transitions, acquired=False)
        duration = spec.lease_duration_seconds or self._duration_s
        expired = time.monotonic() - self._observed_at > duration
        if spec.holder_identity and not expired:
            return 0
        return await self._write(api, lease, transitions + 1, acquired=True)

    async def _create(self, api: client.CoordinationV1Api) -> int:
        now = _now()
        body = client.V1Lease(
            metadata=client.V1ObjectMeta(name=self._name, namespace=self._namespace),
            spec=client.V1LeaseSpec(
                holder_identity=self.holder, lease_duration_seconds=self._duration_s,
                acquire_time=now, renew_time=now, lease_transitions=0,
            ),
        )  # fmt: skip
        try:
            await api.create_namespaced_lease(
                self._namespace, body, _request_timeout=self._timeout_s
            )
        except ApiException as exc:
            if exc.status == 409:
                return 0  # another gateway created it first
            raise
        return 1

    async def _write(self, api: client.CoordinationV1Api, lease: Any, transitions: int,
                     acquired: bool) -> int:  # fmt: skip
        now = _now()
        spec = lease.spec
        spec.holder_identity = self.holder
        spec.lease_duration_seconds = self._duration_s
        spec.renew_time = now
        spec.lease_transitions = transitions
        if acquired:
            spec.acquire_time = now
        try:
            # The resourceVersion read goes with it: a write in between makes this a 409.
            await api.replace_namespaced_lease(
                self._name, self._namespace, lease, _request_timeout=self._timeout_s
            )
        except ApiException as exc:
            if exc.status == 409:
                return 0
            raise
        return transitions + 1

    async def fence(self) -> None:
        """Raise LostLeadership unless the Lease is still ours under our token."""
        if not self.held:
            raise LostLeadership("not the placement leader")
        try:
            api = await self._coordination()
            lease = await api.read_namespaced_lease(
                self._name, self._namespace, _request_timeout=self._timeout_s
            )
        except _UNREACHABLE as exc:
            raise LostLeadership(f"the placement Lease cannot be read: {_reason(exc)}") from exc
        spec = lease.spec
        if spec.holder_identity != self.holder or (spec.lease_transitions or 0) + 1 != self.token:
            token, self.token = self.token, 0
            raise LostLeadership(f"the placement lease (token {token}) is no longer ours")

    async def release(self) -> None:
        """Give the Lease up now (no holder), if it is ours; then close the API client."""
        if not self.held:
            await self.close()
            return
        self.token = 0
        try:
            api = await self._coordination()
            lease = await api.read_namespaced_lease(
                self._name, self._namespace, _request_timeout=self._timeout_s
            )
            if lease.spec.holder_identity == self.holder:
                lease.spec.holder_identity = None  # type: ignore[assignment]  # optional
                await api.replace_namespaced_lease(
                    self._name, self._namespace, lease, _request_timeout=self._timeout_s
                )
        except _UNREACHABLE as exc:
            raise LeaseUnavailable(f"the Kubernetes API: {_reason(exc)}") from exc
        finally:
            await self.close()

    async def close(self) -> None:
        if self._api_client is not None:
            await self._api_client.close()
        self._api = self._api_client = None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status} {exc.reason}"
    return f"{type(exc).__name__}: {exc}"
