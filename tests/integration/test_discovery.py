"""Replicas from DNS, against a real DNS server whose records change (dnslib)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gateway.config import ModelConfig
from gateway.config.schema import BackendKind, Discovery
from gateway.serving.runtime import _route
from gateway.upstream.discovery import ReplicaDiscovery
from gateway_tools.dev.processes import free_port
from tests import ports
from tests.dns_server import Zone, dns_server
from tests.fake_kube_api import FakeApi, kubeconfig, serving


@pytest.fixture
def dns() -> Iterator[tuple[str, Zone]]:
    with dns_server() as served:
        yield served


def model(backend: str, nameserver: str, **discovery: object) -> ModelConfig:
    return ModelConfig.model_validate(
        {"backend": backend, "discovery": {"nameservers": [nameserver], **discovery}}
    )


async def test_a_records_become_the_replica_set_and_follow_changes(dns: tuple[str, Zone]) -> None:
    nameserver, zone = dns
    zone.set_a("triton.example.internal", ["10.0.0.2", "10.0.0.1"])
    route = _route("m", model("triton_http", nameserver, dns="triton.example.internal", port=8000))
    changed: list[str] = []
    discovery = ReplicaDiscovery([route], on_change=changed.append)
    assert await discovery.refresh(route) is True
    assert [r.url for r in route.pool.replicas] == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    assert route.pool.replicas[0].metrics_url == "http://10.0.0.1:8002/metrics"
    kept = route.pool.replicas[1]
    kept.outstanding = 3  # requests in flight there
    zone.set_a("triton.example.internal", ["10.0.0.2", "10.0.0.3"])
    assert await discovery.refresh(route) is True
    assert [r.url for r in route.pool.replicas] == ["http://10.0.0.2:8000", "http://10.0.0.3:8000"]
    # The replica that stays is the same object: its in-flight count carries over.
    assert route.pool.replicas[0] is kept and kept.outstanding == 3
    assert await discovery.refresh(route) is False  # the same answer changes nothing
    assert changed == ["m", "m"]


async def test_srv_records_give_each_replica_its_port_and_grpc_gets_host_port(
    dns: tuple[str, Zone],
) -> None:
    nameserver, zone = dns
    zone.set_a("pod-a.example.internal", ["127.0.0.1"])
    zone.set_a("pod-b.example.internal", ["127.0.0.1"])
    zone.set_srv(
        "_grpc._tcp.triton.example.internal",
        [("pod-a.example.internal", 8001), ("pod-b.example.internal", 9001)],
    )
    route = _route(
        "m",
        model("triton_grpc", nameserver, dns="_grpc._tcp.triton.example.internal", record="SRV"),
    )
    await ReplicaDiscovery([route]).refresh(route)
    assert [r.url for r in route.pool.replicas] == ["127.0.0.1:8001", "127.0.0.1:9001"]
    assert route.config.backend is BackendKind.TRITON_GRPC


async def test_a_failed_lookup_keeps_the_replicas(dns: tuple[str, Zone]) -> None:
    nameserver, zone = dns
    zone.set_a("triton.example.internal", ["10.0.0.1"])
    route = _route("m", model("openai", nameserver, dns="triton.example.internal", port=443,
                              scheme="https"))  # fmt: skip
    discovery = ReplicaDiscovery([route])
    await discovery.refresh(route)
    zone.set_a("triton.example.internal", [])  # NXDOMAIN: every pod restarting, or a typo
    assert await discovery.refresh(route) is False
    assert [r.url for r in route.pool.replicas] == ["https://10.0.0.1:443"]


def test_a_records_need_a_port_and_srv_records_refuse_one() -> None:
    with pytest.raises(ValueError, match="A records carry no port"):
        Discovery.model_validate({"dns": "x"})
    with pytest.raises(ValueError, match="SRV records carry their own port"):
        Discovery.model_validate({"dns": "x", "record": "SRV", "port": 1})


@pytest.fixture
async def kube(tmp_path: Path) -> AsyncIterator[tuple[FakeApi, str]]:
    port = free_port(start=ports.DNS_SERVERS, end=ports.DNS_SERVERS + 500)
    async with serving(port) as fake:
        yield fake, str(kubeconfig(tmp_path / "kubeconfig", port))


async def test_endpointslices_give_the_ready_endpoints_on_the_named_port(
    kube: tuple[FakeApi, str],
) -> None:
    fake, config_path = kube
    fake.set_endpoints("ml", "triton-llm", "grpc", [("10.0.0.1", 8001, True),
                                                    ("10.0.0.2", 8001, False),
                                                    ("10.0.0.3", 8001, True)])  # fmt: skip
    settings = {"kubernetes": {"service": "triton-llm", "port": "grpc", "namespace": "ml",
                               "kubeconfig": config_path}}  # fmt: skip
    route = _route("m", ModelConfig.model_validate({"backend": "triton_grpc",
                                                    "discovery": settings}))  # fmt: skip
    discovery = ReplicaDiscovery([route])
    try:
        assert await discovery.refresh(route) is True
        # The pod that is not ready (still loading its model) is left out.
        assert [r.url for r in route.pool.replicas] == ["10.0.0.1:8001", "10.0.0.3:8001"]
        fake.set_endpoints("ml", "triton-llm", "grpc", [("10.0.0.3", 8001, True)])
        assert await discovery.refresh(route) is True
        assert [r.url for r in route.pool.replicas] == ["10.0.0.3:8001"]
        fake.set_endpoints("ml", "triton-llm", "grpc", [])  # every pod restarting
        assert await discovery.refresh(route) is False
        assert [r.url for r in route.pool.replicas] == ["10.0.0.3:8001"]
    finally:
        await discovery.stop()


async def test_an_unreachable_kubernetes_api_keeps_the_replicas(tmp_path: Path) -> None:
    port = free_port(start=ports.DNS_SERVERS, end=ports.DNS_SERVERS + 500)  # nothing there
    settings = {"kubernetes": {"service": "s", "port": 8000, "namespace": "ml",
                               "kubeconfig": str(kubeconfig(tmp_path / "kc", port))}}  # fmt: skip
    route = _route("m", ModelConfig.model_validate({"backend": "triton_http",
                                                    "discovery": settings}))  # fmt: skip
    route.pool.set_urls(["http://10.0.0.9:8000"])  # as an earlier lookup found them
    discovery = ReplicaDiscovery([route])
    try:
        assert await discovery.refresh(route) is False
        assert [r.url for r in route.pool.replicas] == ["http://10.0.0.9:8000"]
    finally:
        await discovery.stop()


def test_discovery_names_one_source() -> None:
    with pytest.raises(ValueError, match="give one of dns and kubernetes"):
        Discovery.model_validate({"port": 1})
    with pytest.raises(ValueError, match="give one of dns and kubernetes"):
        Discovery.model_validate({"dns": "x", "port": 1,
                                  "kubernetes": {"service": "s", "port": "http"}})  # fmt: skip


def test_replicas_and_discovery_exclude_each_other() -> None:
    with pytest.raises(ValueError, match="replicas and discovery exclude each other"):
        ModelConfig.model_validate({
            "backend": "triton_http", "replicas": [{"url": "http://10.0.0.9:8000"}],
            "discovery": {"dns": "x", "port": 8000},
        })  # fmt: skip


async def test_an_srv_target_that_does_not_resolve_leaves_the_others(
    dns: tuple[str, Zone],
) -> None:
    nameserver, zone = dns
    zone.set_a("pod-a.example.internal", ["127.0.0.1"])
    zone.set_srv("_http._tcp.t.example.internal",
                 [("pod-a.example.internal", 8000), ("gone.example.internal", 9000)])  # fmt: skip
    route = _route("m", model("triton_http", nameserver, dns="_http._tcp.t.example.internal",
                              record="SRV"))  # fmt: skip
    await ReplicaDiscovery([route]).refresh(route)
    assert [r.url for r in route.pool.replicas] == ["http://127.0.0.1:8000"]
