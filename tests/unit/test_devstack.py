"""Local processes for the demo and the tests: free ports, waits that Ctrl-C can stop,
and the demo's checks before it starts anything."""

from __future__ import annotations

import ctypes.util
import os
import socket
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

import pytest

from gateway.dev import demo
from gateway.dev.processes import (
    Cancelled,
    ephemeral_ports,
    free_port,
    port_is_free,
    wait_http_ok,
    wait_listening,
)
from gateway.dev.sim import server


def test_free_port_never_picks_an_ephemeral_port() -> None:
    ephemeral = ephemeral_ports()
    port = free_port(start=ephemeral.start - 50, end=ephemeral.start + 2000)
    assert port < ephemeral.start
    assert port_is_free(port)


def test_free_port_skips_a_port_that_is_taken() -> None:
    start = free_port(start=12000, end=12100)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", start))
        holder.listen()
        assert free_port(start=start, end=start + 2) == start + 1


# --- waits that a stop request ends ------------------------------------------------


def _set_soon(event: threading.Event, delay_s: float = 0.2) -> None:
    threading.Timer(delay_s, event.set).start()


def test_wait_http_ok_gives_up_when_cancelled() -> None:
    cancel = threading.Event()
    _set_soon(cancel)
    started = time.monotonic()
    with pytest.raises(Cancelled):
        wait_http_ok(f"http://127.0.0.1:{free_port()}/", timeout_s=60, cancel=cancel)
    assert time.monotonic() - started < 2.0


def test_wait_listening_stops_the_process_when_cancelled() -> None:
    process = subprocess.Popen(["sleep", "30"], start_new_session=True)
    cancel = threading.Event()
    _set_soon(cancel)
    with pytest.raises(Cancelled):
        wait_listening(process, free_port(), "sleep", timeout_s=60, cancel=cancel)
    assert process.poll() is not None


# --- the demo's checks ----------------------------------------------------------------


def test_demo_finds_its_config_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    found = demo.resolve_config("config/gateway.yaml")
    assert found is not None and os.path.isabs(found) and os.path.isfile(found)
    assert demo.resolve_config("config/nope.yaml") is None


def test_demo_example_runs_with_this_interpreter() -> None:
    assert f"  {sys.executable} - <<'PY'" in demo._examples(8080)
    assert "  python - " not in demo._examples(8080)


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


# --- triton-sim's libpython ------------------------------------------------------------


def test_triton_sim_names_the_package_when_libpython_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert server.libpython_problem() is None  # this machine runs triton-sim
    monkeypatch.setattr(sysconfig, "get_config_var", lambda name: str(tmp_path))
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"

    problem = server.libpython_problem()

    assert problem is not None
    assert f"libpython{version}.so.1.0 not found" in problem
    assert f"apt-get install libpython{version}" in problem
    sim = server.TritonSim(free_port(span=3), "llm-small")
    with pytest.raises(server.TritonSimError, match=f"libpython{version}"):
        sim.start()
    assert sim.workdir is None  # nothing was written or started
