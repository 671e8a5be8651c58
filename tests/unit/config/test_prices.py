"""`prices:` in gateway.yaml: what each model costs, checked as the rest of the file is."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config.loader import check_config, load_config
from gateway.config.schema import Price
from tests.unit.config.test_loader import GATEWAY, TENANTS, write

PRICES = """\
prices:
  currency: EUR
  models:
    llm-large: {input_per_million: 3.0, cached_input_per_million: 0.3, output_per_million: 15.0}
    llm-small: {input_per_million: 0.15, output_per_million: 0.6}
"""


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GATEWAY_REDIS_URL", raising=False)
    write("tenants.yaml", TENANTS)


def test_prices_load_with_their_currency() -> None:
    config = load_config(write("gateway.yaml", PRICES + GATEWAY))
    prices = config.gateway.prices
    assert prices.currency == "EUR"
    assert prices.models["llm-small"].cached_input_per_million is None
    assert prices.models["llm-large"].cached_input_per_million == 0.3


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("-1.0", "Input should be greater than or equal to 0"),
        ('"3"', "Input should be a valid number"),
        ("true", "Input should be a valid number"),
    ],
)
def test_a_negative_or_non_numeric_price_is_refused_at_its_line(value: str, why: str) -> None:
    text = PRICES.replace("output_per_million: 0.6", f"output_per_million: {value}")
    found = check_config(write("gateway.yaml", text + GATEWAY))
    assert found == [f"gateway.yaml:5: prices.models.llm-small.output_per_million: {why}"]


def test_a_price_for_a_model_that_is_not_defined_is_refused() -> None:
    text = PRICES + "    llm-huge: {input_per_million: 1, output_per_million: 2}\n"
    found = check_config(write("gateway.yaml", text + GATEWAY))
    assert found == ["gateway.yaml:6: prices.models.llm-huge: model 'llm-huge' is not defined"]


def test_a_cost_is_exact_in_micro_units_and_never_rounded_down() -> None:
    large = Price(input_per_million=3.0, cached_input_per_million=0.3, output_per_million=15.0)
    # 1,000 prompt tokens of which 400 cached, 200 out: 600 * 3 + 400 * 0.3 + 200 * 15.
    assert large.cost_micros(1000, 400, 200) == 1800 + 120 + 3000
    small = Price(input_per_million=0.15, output_per_million=0.6)
    assert small.cost_micros(1, 0, 0) == 1  # 0.15 micro-units: rounded up, not to 0
    assert small.cost_micros(1000, 1000, 0) == 150  # cached at the input price
    assert small.cost_micros(10, 50, 0) == 2  # no more cached than prompt tokens


def test_the_eval_prices_file_shape_reads_the_same_table() -> None:
    # `gateway eval`'s prices file is `currency` and `models` with the same names.
    from gateway_tools.eval.pricing import Prices as EvalPrices

    config = load_config(write("gateway.yaml", PRICES + GATEWAY))
    table = config.gateway.prices.model_dump()
    assert EvalPrices.from_dict(table).cost("llm-large", 1_000_000, 0) == 3.0


def test_gateway_eval_reads_a_gateway_yaml_as_its_prices_file() -> None:
    from gateway_tools.eval.pricing import load_prices

    prices = load_prices(Path(write("gateway.yaml", PRICES + GATEWAY)))
    assert prices.currency == "EUR"
    assert prices.cost("llm-small", 1_000_000, 1_000_000) == 0.15 + 0.6
