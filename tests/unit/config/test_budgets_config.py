"""`budgets:` in tenants.yaml: checked as the rest of the file is, each problem at its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config.loader import load_config
from tests.unit.config.test_loader import GATEWAY, TENANTS, problems, write


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GATEWAY_REDIS_URL", raising=False)


def test_budgets_load_in_micro_units() -> None:
    write("tenants.yaml", TENANTS + "    budgets:\n      - {amount: 0.05, period: day}\n")
    [budget] = load_config(write("gateway.yaml", GATEWAY)).tenants.tenants["acme"].budgets
    assert (budget.amount_micros, budget.period, budget.model, budget.soft) == (
        50_000, "day", None, 0.8,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("budget", "why"),
    [
        ("{amount: -1, period: day}", "amount: Input should be greater than or equal to 0.000001"),
        (
            "{amount: 0.0000001, period: day}",
            "amount: Input should be greater than or equal to 0.000001",
        ),
        ('{amount: "ten", period: day}', "amount: Input should be a valid number"),
        ("{amount: 1, period: week}", "period: Input should be 'day', 'month' or 'total'"),
        ("{amount: 1, soft: 1.5}", "soft: Input should be less than or equal to 1"),
    ],
)
def test_a_bad_budget_is_refused_at_its_line(budget: str, why: str) -> None:
    tenants = TENANTS + f"    budgets:\n      - {budget}\n"
    assert problems(tenants=tenants) == [f"tenants.yaml:6: tenants.acme.budgets[0].{why}"]


def test_a_budget_for_an_undefined_model_or_a_second_for_the_same_scope_is_refused() -> None:
    tenants = TENANTS + (
        "    budgets:\n"
        "      - {amount: 1, period: day, model: llm-huge}\n"
        "      - {amount: 1, period: month}\n"
        "      - {amount: 2, period: month}\n"
    )
    assert problems(tenants=tenants) == [
        "tenants.yaml:6: tenants.acme.budgets[0].model: a budget for model 'llm-huge', "
        "which is not defined",
        "tenants.yaml:8: tenants.acme.budgets[2]: a second budget for the same period and model",
    ]
