"""gateway.config.extensions: the control plane found by entry point, and a config that
names a cluster file refused at its line when the control plane is not installed (the
image's server-only build still declares the entry points)."""

from __future__ import annotations

from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
import yaml

from gateway.config import check_config, extensions
from gateway_control.cluster_check import cluster_problems


def test_the_installed_control_plane_is_found() -> None:
    assert extensions.cluster_part("check") is cluster_problems


def with_entry_points(monkeypatch: pytest.MonkeyPatch, *found: EntryPoint) -> None:
    monkeypatch.setattr(extensions, "entry_points", lambda group, name: list(found))


def test_a_declared_program_that_is_not_installed_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    missing = EntryPoint("check", "gateway_absent.cluster_check:problems", extensions.CLUSTER_GROUP)
    with_entry_points(monkeypatch, missing)
    assert extensions.cluster_part("check") is None


def test_a_broken_program_is_not_taken_for_an_absent_one(monkeypatch: pytest.MonkeyPatch) -> None:
    # The package is there; a module it names is not: an error to see, not to hide.
    broken = EntryPoint("check", "gateway_control.no_such_module:x", extensions.CLUSTER_GROUP)
    with_entry_points(monkeypatch, broken)
    with pytest.raises(ModuleNotFoundError):
        extensions.cluster_part("check")


def test_a_cluster_file_without_the_control_plane_is_refused_at_its_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with_entry_points(
        monkeypatch,
        EntryPoint("check", "gateway_absent.cluster_check:problems", extensions.CLUSTER_GROUP),
    )
    gateway = {
        "cluster_file": "cluster.yaml",
        "models": {"m": {"backend": "triton_http", "replicas": [{"url": "http://127.0.0.1:1"}]}},
    }
    (tmp_path / "gateway.yaml").write_text(yaml.safe_dump(gateway))
    tenant = {"api_keys": ["sha256:" + "0" * 64], "models": ["m"]}
    (tmp_path / "tenants.yaml").write_text(yaml.safe_dump({"tenants": {"acme": tenant}}))
    problems = check_config(str(tmp_path / "gateway.yaml"))
    assert problems == [f"{tmp_path / 'gateway.yaml'}:1: cluster_file: {extensions.NOT_INSTALLED}"]
