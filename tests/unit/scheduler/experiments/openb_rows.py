"""A tiny openb slice (pods and nodes) for the job-trace and command-line tests."""

from __future__ import annotations

from pathlib import Path

from tests.unit.scheduler.packing_helpers import POD_HEADER

PODS = [
    "p0,4000,8192,1,1000,,LS,Running,0,3600,0",
    "p1,2000,4096,1,500,,BE,Succeeded,100,400,100",
    "p2,8000,16384,2,1000,,Burstable,Running,200,5000,200",
    "p3,1000,2048,0,0,,BE,Failed,300,300,300",
    "p4,4000,8192,1,1000,T4,Guaranteed,Running,400,2400,400",
    "p5,2000,4096,1,250,,BE,Pending,500,900,",
]


def write_openb(tmp_path: Path) -> tuple[Path, Path]:
    pods = tmp_path / "pods.csv"
    pods.write_text(POD_HEADER + "\n".join(PODS) + "\n")
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,131072,2,T4\nn1,32000,131072,2,P100\n"
    )
    return pods, nodes
