"""The queueing replay's configuration, and the checkpoint interval it gives a job. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from gateway_control.scheduler.queueing.checkpoint import daly_interval, young_interval
from gateway_control.scheduler.queueing.failures import HOUR
from gateway_control.scheduler.queueing.jobs import Job

ON_PREEMPT = ("auto", "checkpoint", "discard")
CHECKPOINT_RULES = ("trace", "young", "daly")


@dataclass(frozen=True, slots=True)
class QueueConfig:
    """How to replay: placement policy by name, seed (policy and failures), failures
    (`fail_mtbf_s` per node, None: no failures), what a preemption does with unsaved work
    (`auto`: checkpoint when that costs less time than the work it would lose), and where
    checkpoint intervals come from (`trace`, or Young's or Daly's optimum for the MTBF)."""

    policy: str = "fgd"
    seed: int = 0
    fail_mtbf_s: float | None = None
    repair_s: float = 4 * HOUR
    on_preempt: str = "auto"
    checkpoint_rule: str = "trace"
    series_points: int = 200
    retry_s: float = 10.0  # a failed preemption search waits this long before another

    def __post_init__(self) -> None:
        if self.on_preempt not in ON_PREEMPT:
            raise ValueError(f"on_preempt must be one of {', '.join(ON_PREEMPT)}")
        if self.checkpoint_rule not in CHECKPOINT_RULES:
            raise ValueError(f"checkpoint_rule must be one of {', '.join(CHECKPOINT_RULES)}")
        if self.checkpoint_rule != "trace" and self.fail_mtbf_s is None:
            raise ValueError(f"checkpoint_rule {self.checkpoint_rule} needs an MTBF")


def checkpoint_interval(job: Job, rule: str, mtbf_s: float | None) -> float:
    """The work between a job's checkpoints: the trace's, or the optimum for its checkpoint
    cost and the MTBF of the node it runs on (a job runs on one node). A job with no
    checkpoint cost keeps the trace's interval: the optimum would be zero."""
    if rule == "trace" or mtbf_s is None or job.checkpoint_cost <= 0:
        return job.checkpoint_interval
    if rule == "young":
        return young_interval(job.checkpoint_cost, mtbf_s)
    return daly_interval(job.checkpoint_cost, mtbf_s)
