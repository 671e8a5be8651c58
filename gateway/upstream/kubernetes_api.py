"""Reaching the Kubernetes API (kubernetes_asyncio): from a pod with its service account,
or elsewhere with a kubeconfig; and the namespace a gateway pod runs in."""

from __future__ import annotations

import os
from pathlib import Path

from kubernetes_asyncio import client, config

_SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def pod_namespace(configured: str | None = None) -> str:
    """`configured`, else $POD_NAMESPACE, else the pod's service-account namespace, else
    `default`."""
    if configured:
        return configured
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    if _SERVICE_ACCOUNT_NAMESPACE.exists():
        return _SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    return "default"


async def api_client(kubeconfig: str | None = None) -> client.ApiClient:
    """A client of the cluster's API: the pod's service account inside a cluster (unless
    a kubeconfig is given), else the kubeconfig ($KUBECONFIG or ~/.kube/config)."""
    configuration = client.Configuration()
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration
        )
    else:
        await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    return client.ApiClient(configuration)
