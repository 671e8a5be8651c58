"""gateway_control.scheduler.fragmentation: hand-computed fragmentation; the target workload."""

from __future__ import annotations

import pytest

from gateway_control.scheduler.fragmentation import Fragmentation, Shape, target_workload
from tests.unit.scheduler.packing_helpers import pod

HALF_AND_WHOLE = (
    Shape(1, 500, 0, 0, frozenset(), 0.5),
    Shape(1, 1000, 0, 0, frozenset(), 0.5),
)


@pytest.mark.parametrize(
    ("free", "cpu", "expected"),
    [
        ((300, 1000), 1000, 300.0),  # both shapes fit; only the 300 GPU is fragmented
        ((600, 1000), 1000, 0.5 * 600),  # 600 serves the 500 shape, not the whole one
        ((300, 400), 1000, 700.0),  # nothing fits: all idle GPU for both shapes
        ((0, 0), 1000, 0.0),
        ((600, 700), 1000, 0.5 * 0 + 0.5 * 1300),  # half fits everywhere; whole nowhere
    ],
)
def test_fragmentation_hand_computed(free: tuple[int, int], cpu: int, expected: float) -> None:
    assert Fragmentation(HALF_AND_WHOLE).of_state("T4", free, cpu, 0) == pytest.approx(expected)


def test_fragmentation_counts_cpu_and_model_and_multi_gpu() -> None:
    shapes = (
        Shape(2, 1000, 8000, 0, frozenset(), 0.25),
        Shape(1, 250, 0, 0, frozenset({"A10"}), 0.75),
    )
    frag = Fragmentation(shapes)
    # Two whole GPUs and enough CPU: the two-GPU shape sees the 200 as fragmented;
    # the A10-only shape cannot run on a T4: all 2200 idle.
    assert frag.of_state("T4", (200, 1000, 1000), 8000, 0) == pytest.approx(
        0.25 * 200 + 0.75 * 2200
    )
    # Too little CPU for the two-GPU shape: all idle for it too.
    assert frag.of_state("T4", (200, 1000, 1000), 7999, 0) == pytest.approx(2200)
    # On an A10 the 250 shape fits; of its GPUs only the 200 one is too small for it.
    assert frag.of_state("A10", (200, 1000, 1000), 8000, 0) == pytest.approx(200)


def test_fragmentation_counts_memory() -> None:
    frag = Fragmentation((Shape(1, 500, 0, 4096, frozenset(), 1.0),))
    assert frag.of_state("T4", (300, 1000), 0, 4096) == pytest.approx(300)
    assert frag.of_state("T4", (300, 1000), 0, 4095) == pytest.approx(1300)


def test_target_workload_weights_by_popularity() -> None:
    pods = [pod(milli=500)] * 3 + [pod()] + [pod(num_gpu=0, milli=0)] * 5
    shapes = target_workload(pods)
    assert [(s.per_gpu_milli, s.weight) for s in shapes] == [(500, 0.75), (1000, 0.25)]
