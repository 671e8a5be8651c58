"""The closed loop's second place to act: a model's Triton Deployment on Kubernetes.

For the models `autoscaling.kubernetes.deployments` names, the leader sets the replicas
of the model's Deployment through its `scale` subresource (apps/v1), as `kubectl scale`
does; Kubernetes starts and stops the pods (readiness probes keep a new pod out of the
Service until it is ready, preStop and the grace period drain one that goes), and the
gateways find the pods through the Service's EndpointSlices (`discovery`). What is
placed is the scale's `status.replicas`.

It needs a Role that may get and patch `deployments/scale` in the namespace.
"""

from __future__ import annotations

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config import ConfigException

from gateway.upstream.kubernetes_api import api_client, pod_namespace
from gateway_control.cluster_config import KubernetesScaling

# ConfigException: no kubeconfig, or no service-account token in the pod.
SCALE_ERRORS = (ApiException, ConfigException, aiohttp.ClientError, OSError, TimeoutError)
_TIMEOUT_S = 10.0


class DeploymentScaler:
    """Reads and sets the scale of each managed model's Deployment."""

    def __init__(self, settings: KubernetesScaling) -> None:
        self.deployments = dict(settings.deployments)
        self._namespace = pod_namespace(settings.namespace)
        self._kubeconfig = settings.kubeconfig
        self._api: client.AppsV1Api | None = None
        self._client: client.ApiClient | None = None

    def manages(self, model: str) -> bool:
        """Whether `model`'s replicas are its Deployment's pods."""
        return model in self.deployments

    async def _apps(self) -> client.AppsV1Api:
        if self._api is None:
            self._client = await api_client(self._kubeconfig)
            self._api = client.AppsV1Api(self._client)
        return self._api

    async def replicas(self, model: str) -> int:
        """The pods the Deployment has now (`status.replicas`)."""
        apps = await self._apps()
        scale = await apps.read_namespaced_deployment_scale(
            self.deployments[model], self._namespace, _request_timeout=_TIMEOUT_S
        )
        return int(scale.status.replicas or 0) if scale.status is not None else 0

    async def set_replicas(self, model: str, replicas: int) -> None:
        """Ask for `replicas` pods (a merge patch of `spec.replicas`, as `kubectl scale`)."""
        apps = await self._apps()
        # `_content_type` goes through the generated client's **kwargs (its stubs miss it).
        await apps.patch_namespaced_deployment_scale(  # type: ignore[call-arg]
            self.deployments[model],
            self._namespace,
            {"spec": {"replicas": replicas}},
            _content_type="application/merge-patch+json",
            _request_timeout=_TIMEOUT_S,
        )

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = self._api = None
