"""`stored_responses:` in tenants.yaml (issue 40): a tenant's quota on its stored Responses
API answers, with defaults, each bad value refused at its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config.loader import load_config
from tests.unit.config.test_loader import GATEWAY, TENANTS, problems, write


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GATEWAY_REDIS_URL", raising=False)


def test_a_tenant_without_the_section_gets_the_defaults() -> None:
    write("tenants.yaml", TENANTS)
    quota = load_config(write("gateway.yaml", GATEWAY)).tenants.tenants["acme"].stored_responses
    assert (quota.max_bytes, quota.max_count) == (64 * 1024 * 1024, 10_000)


def test_a_tenant_s_own_quota() -> None:
    write("tenants.yaml", TENANTS + "    stored_responses: {max_bytes: 1048576, max_count: 50}\n")
    quota = load_config(write("gateway.yaml", GATEWAY)).tenants.tenants["acme"].stored_responses
    assert (quota.max_bytes, quota.max_count) == (1_048_576, 50)


@pytest.mark.parametrize(
    ("setting", "why"),
    [
        ("{max_bytes: 0}", ".max_bytes: Input should be greater than 0"),
        ("{max_bytes: -5}", ".max_bytes: Input should be greater than 0"),
        ('{max_bytes: "64MB"}', ".max_bytes: Input should be a valid integer"),
        ("{max_count: true}", ".max_count: Input should be a valid integer"),
        ("{max_count: 1.5}", ".max_count: Input should be a valid integer"),
        ("{max_entries: 5}", ": unknown key 'max_entries'"),
        ("[1, 2]", ": expected a mapping"),
    ],
)
def test_a_bad_quota_is_refused_at_its_line(setting: str, why: str) -> None:
    tenants = TENANTS + f"    stored_responses: {setting}\n"
    found = problems(tenants=tenants)
    assert found == [f"tenants.yaml:5: tenants.acme.stored_responses{why}"]
