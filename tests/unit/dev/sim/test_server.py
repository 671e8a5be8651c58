"""triton-sim's libpython: a missing one is named, with the package that provides it."""

from __future__ import annotations

import ctypes.util
import sys
import sysconfig
from pathlib import Path

import pytest

from gateway_tools.dev.processes import free_port
from gateway_tools.dev.sim import server

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
