"""Checkpointing arithmetic: how far a job got, what a failure loses, and the optimal interval.

A job runs in cycles: `interval` seconds of work, then `cost` seconds writing a checkpoint
(holding its GPUs, making no progress). No checkpoint is written after the last piece of
work. A failure loses the work since the last completed checkpoint. Pure functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def young_interval(cost_s: float, mtbf_s: float) -> float:
    """Young's (1974) first-order optimum: work between checkpoints sqrt(2 C M) for a
    checkpoint cost C and a mean time between failures M (both in seconds)."""
    if cost_s <= 0 or mtbf_s <= 0:
        raise ValueError("checkpoint cost and MTBF must be positive")
    return math.sqrt(2.0 * cost_s * mtbf_s)


def daly_interval(cost_s: float, mtbf_s: float) -> float:
    """Daly's (2006) higher-order optimum (restart time left out):
    sqrt(2 C M) * (1 + sqrt(C / 2M) / 3 + (C / 2M) / 9) - C while C < 2M, else M."""
    if cost_s <= 0 or mtbf_s <= 0:
        raise ValueError("checkpoint cost and MTBF must be positive")
    if cost_s >= 2.0 * mtbf_s:
        return mtbf_s
    ratio = cost_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * cost_s * mtbf_s) * (1.0 + math.sqrt(ratio) / 3.0 + ratio / 9.0) - cost_s


def _checkpoints(work: float, interval: float) -> int:
    """Checkpoints written while doing `work`: one after each full interval but the last."""
    if interval <= 0 or work <= interval:
        return 0
    return math.ceil(work / interval) - 1


def run_length(work: float, interval: float, cost: float) -> float:
    """Wall seconds to do `work` seconds of work from a checkpoint, checkpoints included."""
    return work + _checkpoints(work, interval) * cost


@dataclass(frozen=True, slots=True)
class Progress:
    """Where a run stands `elapsed` seconds after its work began (all in seconds)."""

    done: float  # work done in this run
    committed: float  # of which saved by a completed checkpoint
    writing_left: float  # left to write of a checkpoint in progress; 0 when none
    overhead: float  # time spent writing checkpoints so far, the one in progress included

    @property
    def unsaved(self) -> float:
        """Work a failure now would lose."""
        return self.done - self.committed


def progress(elapsed: float, work: float, interval: float, cost: float) -> Progress:
    """The state of a run of `work` seconds (from its last checkpoint) after `elapsed`
    wall seconds of it; `elapsed` is clamped to [0, run_length]."""
    elapsed = min(max(elapsed, 0.0), run_length(work, interval, cost))
    total = _checkpoints(work, interval)
    if total == 0:
        return Progress(done=min(elapsed, work), committed=0.0, writing_left=0.0, overhead=0.0)
    cycle = interval + cost
    cycles = min(int(elapsed // cycle), total)
    into = elapsed - cycles * cycle
    committed = cycles * interval
    if cycles == total or into <= interval:
        done = min(committed + into, work)
        return Progress(done, committed, 0.0, cycles * cost)
    # Writing checkpoint number cycles + 1: the interval's work is done but not yet saved.
    return Progress(committed + interval, committed, cycle - into, cycles * cost + into - interval)
