"""gateway_control.scheduler.policies.fgd: least fragmentation increase; near ties to best-fit."""

from __future__ import annotations

from gateway_control.scheduler.cluster import Cluster, Placement
from gateway_control.scheduler.fragmentation import Shape
from gateway_control.scheduler.policies.fgd import FragmentationGradient
from tests.unit.scheduler.packing_helpers import node, pod


def test_fgd_prefers_the_placement_that_fragments_least() -> None:
    # Target: half-GPU pods. A 500 share on the node with a 500 hole fills it (the node's
    # fragmentation stays 0); on a fresh node it would leave 500 usable, also 0; on the
    # node with 700 free it leaves a 200 fragment.
    nodes = [node("a", gpus=1), node("b", gpus=1), node("c", gpus=1)]
    nodes[0].place(pod(milli=300), (0,))
    nodes[1].place(pod(milli=500), (0,))
    shapes = (Shape(1, 500, 0, 0, frozenset(), 1.0),)
    policy = FragmentationGradient(shapes)
    policy.bind(Cluster(nodes))
    assert policy.choose(pod(milli=500)) == Placement(1, (0,))
    # A 200 share: on a (700 free) it leaves 500, no fragment; on b a 300 fragment; on c
    # an 800 GPU, no fragment either. The tie between a and c goes to the tighter a.
    assert policy.choose(pod(milli=200)) == Placement(0, (0,))


def test_fgd_near_ties_go_to_best_fit() -> None:
    shapes = (Shape(1, 500, 0, 0, frozenset(), 0.995), Shape(1, 100, 3000, 0, frozenset(), 0.005))
    roomy, tight = node("x", gpus=1, cpu=32000), node("t", gpus=1, cpu=4000)
    p = pod(milli=500, cpu=2000)
    # On t the pod leaves 2000 CPU, too little for the small shape: +2.5 fragmentation;
    # on x, +0. Within the tolerance that is a tie, and t is the tighter node.
    exact = FragmentationGradient(shapes, tolerance_milli=0)
    exact.bind(Cluster([roomy, tight]))
    assert exact.choose(p) == Placement(0, (0,))
    tolerant = FragmentationGradient(shapes)
    tolerant.bind(Cluster([roomy, tight]))
    assert tolerant.choose(p) == Placement(1, (0,))
