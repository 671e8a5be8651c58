"""gateway_control.scheduler.queueing.checkpoint: optimal intervals and progress arithmetic."""

from __future__ import annotations

import pytest

from gateway_control.scheduler.queueing.checkpoint import (
    daly_interval,
    progress,
    run_length,
    young_interval,
)


def test_young_and_daly_intervals() -> None:
    # C = 60 s, M = 1 day: Young sqrt(2 * 60 * 86400) = 3219.94 s.
    assert young_interval(60, 86400) == pytest.approx(3219.9379, abs=1e-3)
    # Daly: 3219.94 * (1 + sqrt(60/172800)/3 + (60/172800)/9) - 60 = 3180.06 s.
    assert daly_interval(60, 86400) == pytest.approx(3180.0625, abs=1e-3)
    # Daly's form when the cost is at least twice the MTBF: the MTBF.
    assert daly_interval(500, 200) == 200
    with pytest.raises(ValueError):
        young_interval(0, 100)


def test_progress_through_checkpoint_cycles() -> None:
    # 3600 s of work, a checkpoint every 1000 s costing 100 s: 3 checkpoints, 3900 s.
    assert run_length(3600, 1000, 100) == 3900
    writing = progress(1050, 3600, 1000, 100)  # 50 s into the first checkpoint
    assert (writing.done, writing.committed, writing.writing_left, writing.overhead) == (
        1000,
        0,
        50,
        50,
    )
    mid = progress(2500, 3600, 1000, 100)
    assert (mid.done, mid.committed, mid.unsaved, mid.overhead) == (2300, 2000, 300, 200)
    end = progress(3900, 3600, 1000, 100)
    assert (end.done, end.committed, end.overhead) == (3600, 3000, 300)
    never = progress(700, 1000, 0, 50)  # interval 0: never checkpoints
    assert (never.done, never.unsaved) == (700, 700)
