"""gateway_control.scheduler.queueing.queue_config: where a job's checkpoint interval comes from."""

from __future__ import annotations

import pytest

from gateway_control.scheduler.queueing.checkpoint import (
    daly_interval,
    young_interval,
)
from gateway_control.scheduler.queueing.queue_config import checkpoint_interval
from tests.unit.scheduler.queueing.replay_helpers import job


def test_checkpoint_interval_rule() -> None:
    j = job("j", cost=60, interval=999)
    assert checkpoint_interval(j, "trace", 86400) == 999
    assert checkpoint_interval(j, "young", 86400) == pytest.approx(young_interval(60, 86400))
    assert checkpoint_interval(j, "daly", 86400) == pytest.approx(daly_interval(60, 86400))
    assert checkpoint_interval(job("free", interval=5), "young", 86400) == 5  # no cost
