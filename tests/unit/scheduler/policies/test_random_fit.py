"""gateway_control.scheduler.policies.random_fit: reproducible by seed."""

from __future__ import annotations

from gateway_control.scheduler.cluster import Cluster, Placement
from gateway_control.scheduler.policies.registry import make_policy
from tests.unit.scheduler.packing_helpers import node, pod


def test_random_is_reproducible_by_seed() -> None:
    def run(seed: int) -> list[Placement | None]:
        nodes = [node(str(i), gpus=4) for i in range(20)]
        policy = make_policy("random", seed, ())
        cluster = Cluster(nodes)
        policy.bind(cluster)
        out: list[Placement | None] = []
        for _ in range(30):
            p = pod(milli=300)
            placement = policy.choose(p)
            assert placement is not None
            cluster.place(p, placement)
            out.append(placement)
        return out

    assert run(7) == run(7)
    assert run(7) != run(8)
