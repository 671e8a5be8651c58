"""The placement lease as a Kubernetes Lease, against a stand-in API server with the real
one's optimistic concurrency (tests/fake_kube_api.py: no kube-apiserver runs here)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.config.schema import PlacementConfig
from gateway_control.placement.kubernetes_lease import KubernetesLease
from gateway_control.placement.leadership import LostLeadership
from gateway_tools.dev.processes import free_port
from tests import ports
from tests.fake_kube_api import FakeApi, kubeconfig, serving

TTL_S = 1.0


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[tuple[FakeApi, PlacementConfig]]:
    port = free_port(start=ports.DNS_SERVERS, end=ports.DNS_SERVERS + 500)
    async with serving(port) as fake:
        settings = PlacementConfig(
            leader_election="kubernetes", lease_ttl_s=TTL_S, lease_namespace="gw",
            kubeconfig=str(kubeconfig(tmp_path / "kubeconfig", port)),
        )  # fmt: skip
        yield fake, settings


@pytest.fixture
async def leases(api: tuple[FakeApi, PlacementConfig]) -> AsyncIterator[list[KubernetesLease]]:
    _, settings = api
    made = [KubernetesLease(settings, "gw", holder=name) for name in ("a", "b", "c")]
    yield made
    for lease in made:
        await lease.close()


async def test_one_holder_takes_the_lease_and_the_others_find_it_held(
    api: tuple[FakeApi, PlacementConfig], leases: list[KubernetesLease]
) -> None:
    fake, _ = api
    a, b, _ = leases
    assert await a.campaign() == 1
    assert await b.campaign() == 0
    assert await a.campaign() == 1  # renewed
    spec = fake.objects["gw", "gateway-placement"]["spec"]
    assert (spec["holderIdentity"], spec["leaseTransitions"], spec["leaseDurationSeconds"]) == (
        "a", 0, 1,
    )  # fmt: skip


async def test_a_lease_left_unrenewed_is_taken_over_and_fences_its_old_holder(
    leases: list[KubernetesLease],
) -> None:
    a, b, _ = leases
    assert await a.campaign() == 1
    assert await b.campaign() == 0  # b sees it held, and notes when
    await asyncio.sleep(TTL_S / 2)
    assert await b.campaign() == 0  # not expired yet, as b observes it
    await asyncio.sleep(TTL_S * 0.7)  # a renews no more: unchanged for longer than its time
    assert await b.campaign() == 2
    with pytest.raises(LostLeadership, match="token 1"):
        await a.fence()  # a stalled leader finds a newer token before acting
    assert await a.campaign() == 0
    await b.fence()


async def test_of_candidates_racing_for_a_free_lease_exactly_one_wins(
    leases: list[KubernetesLease],
) -> None:
    tokens = await asyncio.gather(*(lease.campaign() for lease in leases))
    assert sorted(tokens) == [0, 0, 1]
    winner = leases[tokens.index(1)]
    await winner.release()
    # Released: another takes it at its next campaign, not a lease's time later.
    others = [lease for lease in leases if lease is not winner]
    again = await asyncio.gather(*(lease.campaign() for lease in others))
    assert sorted(again) == [0, 2]
