"""gateway_control.scheduler.queueing.tenancy: quota and borrowing rules, caps, the YAML mapping."""

from __future__ import annotations

import pytest

from gateway_control.scheduler.queueing.tenancy import (
    Quotas,
    QuotaTenant,
    equal_tenants,
    tenants_from_mapping,
)
from tests.unit.scheduler.queueing.replay_helpers import G


def test_quota_borrowing_rules() -> None:
    quotas = Quotas(
        [
            QuotaTenant("a", 2 * G, "c", borrowing_limit_milli=1 * G),
            QuotaTenant("b", 2 * G, "c"),
            QuotaTenant("solo", 1 * G),
        ]
    )
    assert quotas.admissible("a", 2 * G)  # nominal
    quotas.charge("a", "T4", 2 * G)
    assert quotas.admissible("a", 1 * G)  # borrows 1 of b's idle 2
    assert not quotas.admissible("a", 2 * G)  # over its borrowing limit of 1
    quotas.charge("b", "T4", 2 * G)
    assert not quotas.admissible("a", 1 * G)  # the cohort has nothing idle
    assert quotas.admissible("solo", 1 * G) and not quotas.admissible("solo", 1001)
    assert quotas.ceiling("a") == 3 * G and quotas.ceiling("b") == 4 * G
    assert quotas.ceiling("solo") == 1 * G


def test_model_caps() -> None:
    quotas = Quotas([QuotaTenant("a", 8 * G, model_caps_milli={"V100": 1 * G})])
    assert quotas.model_allowed("a", "V100", G) and quotas.model_allowed("a", "T4", 5 * G)
    quotas.charge("a", "V100", G)
    assert not quotas.model_allowed("a", "V100", 1)


def test_tenants_from_yaml_mapping() -> None:
    tenants = tenants_from_mapping(
        {
            "tenants": {
                "x": {"gpus": 1.5, "cohort": "c", "borrowing_limit": 2, "weight": 2},
                "y": {"gpus": 4, "models": {"A10": 1}},
            }
        }
    )
    x, y = tenants
    assert (x.quota_milli, x.cohort, x.borrowing_limit_milli, x.weight) == (1500, "c", 2000, 2.0)
    assert (y.quota_milli, y.cohort, y.borrowing_limit_milli) == (4000, "", None)
    assert y.model_caps_milli == {"A10": 1000}
    with pytest.raises(ValueError):
        tenants_from_mapping({"tenants": {"z": {"gpus": 1, "oops": 2}}})
    assert [t.quota_milli for t in equal_tenants(["p", "q", "r"], 10 * G)] == [3333] * 3
