"""The same in-process measurement of two source trees, interleaved round by round.

`loadtest/app_cost.py` and `loadtest/limiter_cost.py` measure CPU a request in process.
Machines here drift by tens of percent within minutes, so a comparison of two trees
only means something when they are measured by turns in one run: each tree runs the
measuring script as a child process (`--child`, with that tree on PYTHONPATH), which
measures once per line it reads on stdin and prints its figure.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def own_redis() -> Iterator[str]:
    """A throwaway redis-server on a free port for the measurement: its URL."""
    from gateway_tools.dev.processes import free_port, start_redis, stop

    port = free_port()
    redis = start_redis(port)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        stop(redis)


def trees_to_measure(root: Path, baseline: Path | None) -> dict[str, Path]:
    """This tree, and the baseline tree when one is given."""
    return {"this tree": root} | ({"baseline": baseline.resolve()} if baseline else {})


def measure_by_turns(
    module: str,
    child_args: Sequence[str],
    trees: Mapping[str, Path],
    rounds: int,
    envs: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, list[float]]:
    """Each tree's figures, one a round: `python -m module --child *child_args` in each
    tree, asked in turn; `envs` adds to a named one's environment (the same tree
    measured with tracing on, say)."""
    children = {
        name: subprocess.Popen(
            [sys.executable, "-m", module, "--child", *child_args],
            cwd=tree,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **(envs or {}).get(name, {}), "PYTHONPATH": str(tree)},
        )
        for name, tree in trees.items()
    }
    figures: dict[str, list[float]] = {name: [] for name in children}
    try:
        for _ in range(rounds):
            for name, child in children.items():
                assert child.stdin is not None and child.stdout is not None
                child.stdin.write("go\n")
                child.stdin.flush()
                figures[name].append(float(child.stdout.readline()))
    finally:
        for child in children.values():
            child.kill()
    return figures


def print_figures(figures: Mapping[str, list[float]], unit: str) -> None:
    """Each tree's median and its rounds, `unit` after the figure."""
    for name, values in figures.items():
        shown = ", ".join(f"{v:.1f}" for v in values)
        print(f"{name}: {statistics.median(values):.1f} {unit} (rounds: {shown})")
