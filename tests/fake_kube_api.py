"""A stand-in for the Kubernetes API server, for what cannot run here (no kube-apiserver
can be installed on these machines): Leases (coordination.k8s.io/v1) with the API
server's optimistic concurrency, enough for the gateway's Lease leader election,
EndpointSlices (discovery.k8s.io/v1) listed by label, which a test sets, and the `scale`
subresource of Deployments (apps/v1), read and merge-patched, whose `status.replicas`
follows `spec.replicas` at once (no pods start here: a test reads what was asked).

It keeps what the real one guarantees and the election relies on: a create of an
existing object is a 409 AlreadyExists, a replace must carry the `resourceVersion` it
read (else 409 Conflict), and each write gives the object a new `resourceVersion`.

    python -m tests.fake_kube_api --port P       # serves until killed
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from aiohttp import web

LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
SLICES = "/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"
SERVICE_LABEL = "kubernetes.io/service-name"
SCALE = "/apis/apps/v1/namespaces/{namespace}/deployments/{name}/scale"


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}  # fmt: skip
    return web.json_response(body, status=code)


class FakeApi:
    """The objects and the versions of one fake API server."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self._versions = itertools.count(1)
        # EndpointSlices by (namespace, Service name), as the EndpointSlice controller
        # would keep them.
        self.slices: dict[tuple[str, str], list[dict[str, Any]]] = {}
        # Deployments' replicas by (namespace, name), and every scale patch received.
        self.deployments: dict[tuple[str, str], int] = {}
        self.scale_patches: list[tuple[str, int]] = []

    def set_endpoints(
        self, namespace: str, service: str, port_name: str, endpoints: list[tuple[str, int, bool]]
    ) -> None:
        """The Service's endpoints now: (address, port, ready), one slice for each port."""
        by_port: dict[int, list[dict[str, Any]]] = {}
        for address, port, ready in endpoints:
            by_port.setdefault(port, []).append(
                {"addresses": [address], "conditions": {"ready": ready}}
            )
        self.slices[namespace, service] = [
            {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
             "metadata": {"name": f"{service}-{port}", "namespace": namespace,
                          "labels": {SERVICE_LABEL: service}},
             "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
             "endpoints": members}
            for port, members in by_port.items()
        ]  # fmt: skip

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post(LEASES, self.create)
        app.router.add_get(LEASES + "/{name}", self.read)
        app.router.add_put(LEASES + "/{name}", self.replace)
        app.router.add_get(SLICES, self.list_slices)
        app.router.add_get(SCALE, self.read_scale)
        app.router.add_patch(SCALE, self.patch_scale)
        return app

    def _scale(self, namespace: str, name: str) -> dict[str, Any]:
        replicas = self.deployments[namespace, name]
        return {"apiVersion": "autoscaling/v1", "kind": "Scale",
                "metadata": {"name": name, "namespace": namespace,
                             "resourceVersion": str(next(self._versions))},
                "spec": {"replicas": replicas}, "status": {"replicas": replicas}}  # fmt: skip

    async def read_scale(self, request: web.Request) -> web.Response:
        key = (request.match_info["namespace"], request.match_info["name"])
        if key not in self.deployments:
            return _status(404, "NotFound", f'deployments.apps "{key[1]}" not found')
        return web.json_response(self._scale(*key))

    async def patch_scale(self, request: web.Request) -> web.Response:
        key = (request.match_info["namespace"], request.match_info["name"])
        if key not in self.deployments:
            return _status(404, "NotFound", f'deployments.apps "{key[1]}" not found')
        if request.content_type != "application/merge-patch+json":
            return _status(415, "UnsupportedMediaType", f"{request.content_type} not served here")
        replicas = (await request.json())["spec"]["replicas"]
        self.deployments[key] = replicas
        self.scale_patches.append((key[1], replicas))
        return web.json_response(self._scale(*key))

    async def list_slices(self, request: web.Request) -> web.Response:
        selector = request.query.get("labelSelector", "")
        label, _, service = selector.partition("=")
        if label != SERVICE_LABEL:
            return _status(400, "BadRequest", f"only {SERVICE_LABEL}=<name> is served here")
        items = self.slices.get((request.match_info["namespace"], service), [])
        version = str(next(self._versions))
        body = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSliceList",
                "metadata": {"resourceVersion": version}, "items": items}  # fmt: skip
        return web.json_response(body)

    async def read(self, request: web.Request) -> web.Response:
        key = (request.match_info["namespace"], request.match_info["name"])
        if key not in self.objects:
            return _status(404, "NotFound", f'leases "{key[1]}" not found')
        return web.json_response(self.objects[key])

    async def create(self, request: web.Request) -> web.Response:
        body = await request.json()
        key = (request.match_info["namespace"], body["metadata"]["name"])
        if key in self.objects:
            return _status(409, "AlreadyExists", f'leases "{key[1]}" already exists')
        return web.json_response(self._store(key, body), status=201)

    async def replace(self, request: web.Request) -> web.Response:
        body = await request.json()
        key = (request.match_info["namespace"], request.match_info["name"])
        current = self.objects.get(key)
        if current is None:
            return _status(404, "NotFound", f'leases "{key[1]}" not found')
        sent = body.get("metadata", {}).get("resourceVersion")
        if sent != current["metadata"]["resourceVersion"]:
            return _status(409, "Conflict", "the object has been modified; please apply "
                           "your changes to the latest version and try again")  # fmt: skip
        return web.json_response(self._store(key, body))

    def _store(self, key: tuple[str, str], body: dict[str, Any]) -> dict[str, Any]:
        body = json.loads(json.dumps(body))
        body.update(apiVersion="coordination.k8s.io/v1", kind="Lease")
        meta = body.setdefault("metadata", {})
        meta.update(namespace=key[0], name=key[1], resourceVersion=str(next(self._versions)))
        self.objects[key] = body
        return body


def kubeconfig(path: Path, port: int, namespace: str = "default") -> Path:
    """A kubeconfig that points at the fake server on `port`."""
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "fake", "user": {"token": "not-a-secret"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake",
                                                  "namespace": namespace}}],
    }))  # fmt: skip
    return path


@asynccontextmanager
async def serving(port: int) -> AsyncIterator[FakeApi]:
    """The fake API on 127.0.0.1:`port` in this event loop."""
    api = FakeApi()
    runner = web.AppRunner(api.app())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield api
    finally:
        await runner.cleanup()


async def _serve_forever(port: int) -> None:
    async with serving(port):
        await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    asyncio.run(_serve_forever(parser.parse_args().port))
