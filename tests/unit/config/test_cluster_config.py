"""cluster.yaml read on its own (`load_cluster`): every problem at its file and line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config.source import ConfigError
from gateway_control.cluster_config import load_cluster


def write(tmp_path: Path, data: dict[str, Any]) -> str:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def test_a_bad_cluster_file_is_refused_with_file_and_line(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        {
            "policy": "fastest",
            "nodes": [
                {"name": "a", "url": "http://127.0.0.1:8100", "gpus": 2},
                {"name": "a", "url": "http://127.0.0.1:8110", "gpus": -1},
            ],
            "deployments": [{"model": "chat", "gpus": 2, "gpu_milli": 500}],
        },
    )
    with pytest.raises(ConfigError) as caught:
        load_cluster(path)
    messages = [str(p) for p in caught.value.problems]
    assert any(m.startswith(f"{path}:") and "gpus" in m and "nodes[1]" in m for m in messages)
    assert any("gpu_milli below 1000" in m for m in messages)
    # Cross checks run once the file has the right shape.
    fixed = yaml.safe_load(Path(path).read_text())
    fixed["nodes"][1]["gpus"] = 2
    fixed["deployments"][0]["gpus"] = 1
    with pytest.raises(ConfigError) as again:
        load_cluster(write(tmp_path, fixed))
    lines = [str(p) for p in again.value.problems]
    assert any("duplicate name 'a'" in m and ":6:" in m for m in lines), lines
    assert any("policy: unknown '" in m and ":1:" in m for m in lines), lines


NODE = {"name": "a", "url": "http://127.0.0.1:8100", "gpus": 2}


@pytest.mark.parametrize(
    ("autoscale", "replicas", "complaint"),
    [
        ({"min_replicas": 3, "max_replicas": 2}, 2, "min_replicas is above max_replicas"),
        ({"min_replicas": 1, "max_replicas": 2}, 5, "must be within autoscale"),
        ({"max_replicas": 0}, 1, "max_replicas"),
        ({"max_replicas": 2, "targets": {"utilization": 1.5}}, 1, "utilization"),
        ({"max_replicas": 2, "targets": {"queue_wait_p95_s": -1}}, 1, "queue_wait_p95_s"),
        ({"max_replicas": 2, "scale_down_after_s": "soon"}, 1, "scale_down_after_s"),
        ({"max_replicas": 2, "surprise": 1}, 1, "surprise"),
        ({"max_replicas": 2, "serves": "sometimes"}, 1, "serves"),
        ({"max_replicas": 2, "flap_window_s": -1}, 1, "flap_window_s"),
    ],
)
def test_bad_autoscale_bounds_and_targets_are_refused_at_their_line(
    tmp_path: Path, autoscale: dict[str, Any], replicas: int, complaint: str
) -> None:
    deployment = {"model": "chat", "replicas": replicas, "autoscale": autoscale}
    path = write(tmp_path, {"nodes": [NODE], "deployments": [deployment]})
    with pytest.raises(ConfigError) as caught:
        load_cluster(path)
    messages = [str(p) for p in caught.value.problems]
    assert any(m.startswith(f"{path}:") and complaint in m for m in messages), messages


def test_autoscale_defaults_are_the_documented_ones(tmp_path: Path) -> None:
    deployment = {"model": "chat", "autoscale": {"max_replicas": 4}}
    cluster = load_cluster(write(tmp_path, {"nodes": [NODE], "deployments": [deployment]}))
    scale = cluster.deployments[0].autoscale
    assert scale is not None
    assert (scale.min_replicas, scale.max_replicas, scale.min_runtime_s) == (1, 4, 60.0)
    assert (scale.targets.queue_wait_p95_s, scale.targets.utilization) == (0.5, 0.75)
    assert cluster.autoscaling.interval_s == 10.0
    assert (scale.serves, cluster.autoscaling.batch_classes) == ("online", ["batch"])
    assert scale.flap_window_s == 600.0
