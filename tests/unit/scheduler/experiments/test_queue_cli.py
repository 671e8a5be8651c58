"""gateway_control.scheduler.experiments.queue_cli: `simulate trace` then `simulate queue`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.cli import main
from tests.unit.scheduler.experiments.openb_rows import write_openb


def test_cli_trace_then_queue(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pods, nodes = write_openb(tmp_path)
    trace = tmp_path / "trace.csv"
    derive = ["simulate", "trace", "--pods", str(pods), "--out", str(trace)]
    assert main([*derive, "--tenants", "2", "--seed", "1"]) == 0
    capsys.readouterr()
    args = ["simulate", "queue", "--nodes", str(nodes), "--trace", str(trace)]
    assert main([*args, "--policy", "best-fit", "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["jobs"] == 6 and metrics["completed"] == 6
    assert metrics["policy"] == "best-fit" and len(metrics["series"]["t_s"]) == 200
    assert set(metrics["queueing"]["by_tenant"]) == {"t0", "t1"}
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text("tenants:\n  t0: {gpus: 2, cohort: c}\n  t1: {gpus: 2, cohort: c}\n")
    with_failures = ["--fail-mtbf", "0.5", "--seed", "2", "--checkpoint-rule", "daly"]
    assert main([*args, "--tenants", str(tenants), *with_failures, "--json"]) == 0
    failing = json.loads(capsys.readouterr().out)
    assert failing["completed"] == 6 and failing["fail_mtbf_h"] == 0.5
    assert main(args) == 0
    assert "tenant t0" in capsys.readouterr().out
    assert main([*args, "--checkpoint-rule", "young"]) == 2  # needs an MTBF
