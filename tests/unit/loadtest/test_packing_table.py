"""loadtest/packing_table.py: the results table in one command, on a synthetic slice."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway_control.scheduler.cluster import load_pods
from loadtest.packing_table import NODES_CSV, PODS_CSV, main, seed_range


def write_data(data: Path) -> None:
    nodes = [f"g{i},96000,393216,8,G2" for i in range(4)]
    nodes += [f"t{i},104000,524288,2,T4" for i in range(4)]
    (data / NODES_CSV).write_text("sn,cpu_milli,memory_mib,gpu,model\n" + "\n".join(nodes) + "\n")
    shapes = [(11000, 1, 1000), (3000, 1, 470), (16000, 0, 0), (64000, 8, 1000), (8000, 2, 1000)]
    pods = [
        f"x{i},{cpu},16384,{num},{milli},,LS,Running,0,1,0"
        for i, (cpu, num, milli) in enumerate(shapes * 4)
    ]
    header = (
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
        "creation_time,deletion_time,scheduled_time\n"
    )
    (data / PODS_CSV).write_text(header + "\n".join(pods) + "\n")


def test_seed_ranges() -> None:
    assert seed_range("42-45") == [42, 43, 44, 45]
    assert seed_range("1,5") == [1, 5]


def test_table_and_written_families(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_data(tmp_path)
    out = tmp_path / "families"
    argv = ["--data", str(tmp_path), "--families", "default,multigpu40", "--seeds", "1,2"]
    assert main([*argv, "--policies", "fgd,fgd-plus", "--write", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("| workload | policy |")
    assert [line.split(" | ")[:2] for line in lines[2:]] == [
        ["| default", "fgd"],
        ["| default", "fgd-plus"],
        ["| multigpu40", "fgd"],
        ["| multigpu40", "fgd-plus"],
    ]
    assert all(line.endswith(" µs |") for line in lines[2:])
    written = load_pods(out / "multigpu40.csv")
    assert written and all(p.name.startswith("multigpu40-") for p in written)
    with pytest.raises(SystemExit):
        main([*argv, "--policies", "worst-fit"])
