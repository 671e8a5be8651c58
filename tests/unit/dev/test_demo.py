"""The demo's checks before it starts anything."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

from gateway_tools.dev import demo
from gateway_tools.dev.processes import free_port

# --- the demo's checks ----------------------------------------------------------------


def test_demo_finds_its_config_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    found = demo.resolve_config("config/gateway.yaml")
    assert found is not None and os.path.isabs(found) and os.path.isfile(found)
    assert demo.resolve_config("config/nope.yaml") is None


def test_demo_example_runs_with_this_interpreter() -> None:
    assert f"  {sys.executable} - <<'PY'" in demo._examples(8080, None, "/tmp/x")
    assert "  python - " not in demo._examples(8080, None, "/tmp/x")


def test_demo_shows_where_the_metrics_are() -> None:
    assert "http://127.0.0.1:8081/metrics" in demo._examples(8080, 8081, "/tmp/x")
    assert "/metrics" not in demo._examples(8080, None, "/tmp/x")


def test_demo_refuses_a_broken_config_before_starting_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def must_not_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("the demo started something")

    for name in ("spawn", "start_redis", "free_port"):
        monkeypatch.setattr(demo, name, must_not_run)
    (tmp_path / "gateway.yaml").write_text(
        "cluster_file: cluster.yaml\nmodels:\n  m: {backend: triton_http}\n"
    )
    (tmp_path / "tenants.yaml").write_text("tenants:\n  a: {api_keys: ['${NOPE_KEY}']}\n")
    (tmp_path / "cluster.yaml").write_text(
        "nodes:\n  - {name: a, url: 'http://127.0.0.1:1', gpus: -2}\n"
    )
    monkeypatch.delenv("NOPE_KEY", raising=False)

    assert demo.run_demo(port=8080, config_path=str(tmp_path / "gateway.yaml")) == 1

    err = capsys.readouterr().err
    assert f"{tmp_path}/cluster.yaml:2: nodes[0].gpus: Input should be greater than 0" in err
    assert f"{tmp_path}/tenants.yaml:2: environment variable NOPE_KEY is not set" in err
    assert demo.run_demo(port=8080, config_path=str(tmp_path / "missing.yaml")) == 1
    assert "missing.yaml: no such file" in capsys.readouterr().err


@pytest.mark.parametrize("option", ["--port", "--ops-port"])
def test_demo_refuses_a_taken_port_before_starting_anything(
    option: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def must_not_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("the demo started something")

    for name in ("spawn", "start_redis"):
        monkeypatch.setattr(demo, name, must_not_run)
    monkeypatch.delenv(demo.OPS_PORT_ENV, raising=False)  # run_demo sets it: restored after
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ports = {"port": port, "ops_port": free_port()}
        if option == "--ops-port":
            ports = {"port": free_port(), "ops_port": port}
        assert demo.run_demo(config_path="config/gateway.yaml", **ports) == 1
    err = capsys.readouterr().err
    assert f"port {port} is taken on 127.0.0.1; choose another with {option}" in err
