"""The Kubernetes settings the gateway and its control plane read, checked by
`check-config` as the API would check them (issue 42, item 4): names that the API would
refuse at run time, and a kubeconfig that is not there, are refused at their line."""

from __future__ import annotations

from pathlib import Path

import yaml

from gateway.config import check_config

TENANTS = {"tenants": {"a": {"api_keys": ["sha256:" + "0" * 64], "models": ["*"]}}}


def problems(tmp_path: Path, **sections: object) -> list[str]:
    (tmp_path / "tenants.yaml").write_text(yaml.safe_dump(TENANTS))
    gateway = {"redis": {"url": "embedded://"}, **sections}
    (tmp_path / "gateway.yaml").write_text(yaml.safe_dump(gateway))
    return [p.split(": ", 1)[1] for p in check_config(str(tmp_path / "gateway.yaml"))]


def discovered(**kubernetes: object) -> dict[str, object]:
    return {"m": {"backend": "triton_http", "discovery": {"kubernetes": kubernetes}}}


def test_valid_kubernetes_settings_are_taken(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\n")
    models = discovered(
        service="triton-llm-small", port="grpc", namespace="inference", kubeconfig=str(kubeconfig)
    )
    placement = {"leader_election": "kubernetes", "lease_name": "gateway.placement"}
    assert problems(tmp_path, models=models, placement=placement) == []


def test_names_the_api_would_refuse_are_refused_at_their_line(tmp_path: Path) -> None:
    models = discovered(service="Triton_LLM", port="a-very-long-port-name", namespace="-x")
    placement = {"leader_election": "kubernetes", "lease_name": "bad..name"}
    found = problems(tmp_path, models=models, placement=placement)
    assert len(found) == 4, found  # one each
    assert any(p.startswith("models.m.discovery.kubernetes.service: not a Kubernetes name")
               for p in found)  # fmt: skip
    assert any(p.startswith("models.m.discovery.kubernetes.port") for p in found)
    assert any(p.startswith("models.m.discovery.kubernetes.namespace") for p in found)
    assert any(p.startswith("placement.lease_name: not a Kubernetes name (a DNS subdomain)")
               for p in found)  # fmt: skip


def test_a_kubeconfig_that_is_not_there_is_refused(tmp_path: Path) -> None:
    placement = {"leader_election": "kubernetes", "kubeconfig": str(tmp_path / "nope")}
    models = {"m": {"backend": "triton_http", "replicas": [{"url": "http://127.0.0.1:1"}]}}
    found = problems(tmp_path, models=models, placement=placement)
    assert found == [f"placement.kubeconfig: no such file: {tmp_path / 'nope'}"]
