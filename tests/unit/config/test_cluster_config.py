"""cluster.yaml read on its own (`load_cluster`): every problem at its file and line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config.cluster_config import load_cluster
from gateway.config.source import ConfigError


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
    assert any("policy: unknown" in m and ":1:" in m for m in lines), lines
