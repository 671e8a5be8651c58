"""The demo's published keys are served only where nobody else reaches (the new-user
review of issue 42: the image, run with its own config, made `sk-ops-demo` an admin key
on 0.0.0.0)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config.demo_keys import ALLOW_ENV, published_keys_served
from gateway.config.loader import load_config
from gateway.config.schema import Config

ROOT = Path(__file__).parents[3]


@pytest.fixture
def demo_config(monkeypatch: pytest.MonkeyPatch) -> Config:
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    monkeypatch.delenv("GATEWAY_REDIS_URL", raising=False)
    return load_config(str(ROOT / "config" / "gateway.yaml"))


def test_the_demo_keys_on_loopback_are_the_demo(demo_config: Config) -> None:
    assert published_keys_served(demo_config, ["127.0.0.1", "127.0.0.1"]) is None
    assert published_keys_served(demo_config, ["localhost", "::1"]) is None


@pytest.mark.parametrize(
    "hosts", [["0.0.0.0", "127.0.0.1"], ["127.0.0.1", "0.0.0.0"], ["gw.internal"]]
)
def test_the_demo_keys_where_others_reach_are_refused_naming_them(
    demo_config: Config,
    hosts: list[str],
) -> None:
    why = published_keys_served(demo_config, hosts)
    assert why is not None
    assert "tenants acme, evals, globex, ops" in why and "config/tenants.yaml" in why
    assert f"{ALLOW_ENV}=allow" in why
    # The keys themselves are never in the message.
    assert "sk-" not in why


def test_a_demo_in_a_container_may_be_allowed(
    demo_config: Config,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ALLOW_ENV, "allow")
    assert published_keys_served(demo_config, ["0.0.0.0"]) is None
    monkeypatch.setenv(ALLOW_ENV, "yes")  # only the one word allows it
    assert published_keys_served(demo_config, ["0.0.0.0"]) is not None


def test_a_tenants_file_of_ones_own_is_served_anywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    monkeypatch.delenv("GATEWAY_REDIS_URL", raising=False)
    (tmp_path / "tenants.yaml").write_text(
        "tenants:\n  team:\n    api_keys: ['sha256:" + "ab" * 32 + "']\n    models: ['*']\n"
    )
    (tmp_path / "gateway.yaml").write_text(
        "tenants_file: tenants.yaml\nmodels:\n  m:\n    backend: triton_http\n"
        "    replicas: [{url: 'http://127.0.0.1:8000'}]\n"
    )
    config = load_config(str(tmp_path / "gateway.yaml"))
    assert published_keys_served(config, ["0.0.0.0"]) is None
