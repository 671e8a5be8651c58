"""A job of the queueing replay: a pod's resources plus who owns it and how it may be stopped.

Pure: the trace's CSV reader and writer are in `experiments/jobtrace.py`. Times are in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway_control.scheduler.cluster import GPU_MILLI, Pod


@dataclass(frozen=True, slots=True)
class Job:
    """One job: `pod` is what it asks for (GPUs or a share of one, allowed models, CPU,
    memory); `duration` is its work in seconds, not counting checkpoints or lost work."""

    pod: Pod
    arrival: float
    duration: float
    tenant: str = "default"
    priority: int = 0  # higher wins
    preemptible: bool = True
    checkpoint_interval: float = 0.0  # work between checkpoints; 0: never checkpoints
    checkpoint_cost: float = 0.0  # seconds to write one checkpoint
    min_runtime: float = 0.0  # no preemption before the job has run this long

    @property
    def name(self) -> str:
        """The job's name (its pod's)."""
        return self.pod.name

    @property
    def gpu_milli(self) -> int:
        """GPU held while it runs, in thousandths of a GPU (what quotas count)."""
        return self.pod.requested_milli

    @property
    def gpus(self) -> float:
        """GPU held while it runs, in GPUs (a share of one counts as a fraction)."""
        return self.pod.requested_milli / GPU_MILLI
