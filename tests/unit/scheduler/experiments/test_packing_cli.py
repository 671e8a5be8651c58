"""gateway_control.scheduler.experiments.packing_cli: `gateway simulate packing`."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cli import main
from tests.unit.scheduler.packing_helpers import write_slice


def test_cli_prints_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    nodes_csv, pods_csv = write_slice(tmp_path)
    argv = ["simulate", "packing", "--nodes", str(nodes_csv), "--pods", str(pods_csv)]
    assert main([*argv, "--seed", "5", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["policy"] == "fgd-plus" and doc["seed"] == 5 and len(doc["allocated_gpu_pct"]) == 131
    assert main([*argv, "--seed", "5", "--policy", "random"]) == 0
    assert "random seed 5" in capsys.readouterr().out
    assert (
        main(["simulate", "packing", "--nodes", "/nonexistent", "--pods", "x", "--seed", "1"]) == 2
    )
