"""gateway_control.scheduler.experiments.plots: `simulate queue --plot` writes the charts."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cli import main
from tests.unit.scheduler.experiments.openb_rows import write_openb


def test_cli_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    pods, nodes = write_openb(tmp_path)
    trace = tmp_path / "trace.csv"
    assert main(["simulate", "trace", "--pods", str(pods), "--out", str(trace)]) == 0
    plots = tmp_path / "plots"
    args = ["simulate", "queue", "--nodes", str(nodes), "--trace", str(trace)]
    assert main([*args, "--plot", str(plots), "--json"]) == 0
    assert (plots / "utilization.png").stat().st_size > 0
    assert (plots / "queueing_cdf.png").stat().st_size > 0
