"""`gateway simulate autoscale`: the loop's own decisions and placement, replayed on the
shifting trace of the benchmark's fleet, against static placement on the same arrivals."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import pytest

from gateway.cli import main
from gateway_control.cluster_config import load_cluster
from gateway_control.placement.autoscale_cli import load_trace
from gateway_control.placement.autoscale_sim import SHIFTING, run_policy

FLEET = Path(__file__).parents[3] / "loadtest" / "autoscale-config" / "cluster.yaml"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_loop_meets_the_slo_where_static_placement_does_not_on_no_more_gpu(
    seed: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    cluster = load_cluster(str(FLEET))
    workload = replace(SHIFTING, seed=seed)
    static = run_policy(cluster, workload, loop=False)
    loop = run_policy(cluster, workload, loop=True)
    assert static.requests == loop.requests == len(workload.arrivals())
    assert static.slo_attainment < 0.80
    assert loop.slo_attainment >= 0.95
    assert loop.gpu_seconds <= static.gpu_seconds
    assert loop.refused == 0 and loop.lost == 0
    assert static.replica_changes == 0
    # Replicas follow the two shifts and the quiet, and do not flap in between.
    assert 4 <= loop.replica_changes <= 12


def test_replicas_follow_demand_from_one_model_to_the_other(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR)
    loop = run_policy(load_cluster(str(FLEET)), SHIFTING, loop=True)
    by_time = {round(s.t): s.replicas for s in loop.timeline}
    assert by_time[30] == {"llm-large": 2, "llm-small": 2}  # even
    assert by_time[120]["llm-large"] == 3  # large's rise, on small's replica
    assert by_time[210]["llm-small"] == 3  # small's spike, on large's
    assert by_time[300] == {"llm-large": 1, "llm-small": 1}  # quiet: the minimums


def test_the_command_prints_both_policies_and_writes_the_chart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chart = tmp_path / "replicas.png"
    assert (
        main(["simulate", "autoscale", "--cluster", str(FLEET), "--json", "--plot", str(chart)])
        == 0
    )
    rows = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in rows] == ["static", "closed loop"]
    assert rows[1]["timeline"][0]["replicas"] == {"llm-large": 2, "llm-small": 2}
    assert chart.read_bytes().startswith(b"\x89PNG")


def test_a_bad_cluster_file_is_refused_at_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "cluster.yaml"
    bad.write_text("nodes: []\ndeployments:\n  - model: x\n    replicas: -1\n")
    assert main(["simulate", "autoscale", "--cluster", str(bad)]) == 2
    assert f"{bad}:4" in capsys.readouterr().out


ATTACK = Path(__file__).parents[3] / "loadtest" / "autoscale-attack"


def test_a_trace_file_gives_bursts_of_choices_ramps_and_classes() -> None:
    workload, problems = load_trace(str(ATTACK / "both.yaml"))
    assert problems == [] and workload is not None
    requests = workload.requests()
    globex = [r for r in requests if r.priority == "batch"]
    # 24 requests of 16 choices every 80 s from 20 s on, within 1,800 s: 23 bursts.
    assert len(globex) == 23 * 24 * 16
    assert {r.t for r in globex if r.t < 80} == {20 + i / 24 for i in range(24)}
    streams = [r for r in requests if r.service_s == 1.0]
    assert len(streams) == 21 * 200 and {r.cost_tokens for r in streams} == {320}
    ramp, _ = load_trace(str(ATTACK / "ramp.yaml"))
    assert ramp is not None
    times = [t for t, _ in ramp.arrivals()]
    early = sum(1 for t in times if 60 <= t < 90)
    late = sum(1 for t in times if 330 <= t < 360)
    assert 3 * early < late  # about 16 to 31 a second at first, 146 to 160 at the end


def test_a_bad_trace_file_is_refused_at_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "trace.yaml"
    bad.write_text(
        "profiles:\n  llm-small: {service_s: 1}\nphases:\n"
        "  - {name: a, seconds: 10, rates: {llm-small: 1}}\n"
        "bursts:\n  - {name: b, model: llm-small, every_s: 0, requests: 1}\n"
    )
    cluster = ATTACK / "cluster.yaml"
    assert main(["simulate", "autoscale", "--cluster", str(cluster), "--trace", str(bad)]) == 2
    assert f"{bad}:6" in capsys.readouterr().out
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text(
        "profiles:\n  other: {service_s: 1}\n"
        "phases:\n  - {name: a, seconds: 1, rates: {other: 1}}\n"
    )
    assert main(["simulate", "autoscale", "--cluster", str(cluster), "--trace", str(unknown)]) == 2
    assert "not deployed" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("trace", "most"),
    [("globex", 0), ("acme", 3), ("both", 3)],  # 45, 41 and 9 before issue 40
)
def test_the_attacks_of_issue_40_do_not_make_the_loop_flap(
    trace: str, most: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    workload, _ = load_trace(str(ATTACK / f"{trace}.yaml"))
    assert workload is not None
    loop = run_policy(load_cluster(str(ATTACK / "cluster.yaml")), workload, loop=True)
    assert loop.changes_within(1800) <= most
    assert loop.lost == 0


def test_an_honest_ramp_still_scales_up_within_two_intervals_of_needing_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR)
    workload, _ = load_trace(str(ATTACK / "ramp.yaml"))
    assert workload is not None
    cluster = load_cluster(str(ATTACK / "cluster.yaml"))
    loop = run_policy(cluster, workload, loop=True)
    # The ramp crosses what one replica holds at the 0.75 target (96 a second) at 226.7 s.
    crossing = 60 + 300 * (96 - 16) / (160 - 16)
    ups = [t for t, _, step in loop.changes if step > 0]
    assert len(ups) == 1 and ups[0] <= crossing + 2 * cluster.autoscaling.interval_s
    assert loop.changes_within(1800) == 2  # and back down once the demand went
    assert loop.slo_attainment >= 0.99 and loop.refused == 0
