"""What candidates cost: a price per million tokens in and out, and a person's correction.

A prices file (YAML), or a gateway.yaml, whose `prices:` table has the same shape:

    currency: USD
    manual_correction: 20.0    # what fixing a failed task by hand costs
    models:
      coder-large: {input_per_million: 3.0, output_per_million: 15.0,
                    cached_input_per_million: 0.3}   # optional: cached prompt tokens

Every attempt's tokens are priced, retries included; prompt tokens the server had cached
(a coding tool's calls share most of their prompt) at `cached_input_per_million` when
given, else as any other. The cost per completed task (the
report's unit cost) adds `manual_correction` for each attempt that did not pass: that
task was completed by a person.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway_tools.eval.yaml_files import load_yaml


@dataclass(frozen=True, slots=True)
class Price:
    input_per_million: float
    output_per_million: float
    cached_input_per_million: float | None = None  # None: as any prompt token


@dataclass(frozen=True, slots=True)
class Prices:
    """Prices by model name; a model without one has no cost (None, not zero)."""

    currency: str = "USD"
    manual_correction: float = 0.0
    models: dict[str, Price] = field(default_factory=dict)

    def cost(self, model: str, tokens_in: int, tokens_out: int, cached: int = 0) -> float | None:
        """What `tokens_in` prompt tokens (`cached` of them cached) and `tokens_out`
        completion tokens of `model` cost; None without a price for it."""
        price = self.models.get(model)
        if price is None:
            return None
        cached_price = price.input_per_million
        if price.cached_input_per_million is not None:
            cached_price = price.cached_input_per_million
        return (
            (tokens_in - cached) * price.input_per_million
            + cached * cached_price
            + tokens_out * price.output_per_million
        ) / 1e6

    def describe(self) -> dict[str, Any]:
        return {
            "currency": self.currency,
            "manual_correction": self.manual_correction,
            "models": {name: {"input_per_million": p.input_per_million,
                              "output_per_million": p.output_per_million}
                       for name, p in sorted(self.models.items())},
        }  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Prices:
        models = {
            str(name): Price(
                float(p["input_per_million"]),
                float(p["output_per_million"]),
                None if p.get("cached_input_per_million") is None
                else float(p["cached_input_per_million"]),
            )
            for name, p in (data.get("models") or {}).items()
        }  # fmt: skip
        return cls(
            str(data.get("currency", "USD")), float(data.get("manual_correction", 0.0)), models
        )


def load_prices(path: Path) -> Prices:
    """Load a prices file, or the `prices:` table of a gateway.yaml (the prices the
    gateway charges); ValueError (`file: why`) when it is neither."""
    return load_yaml(path, "prices file", _prices)


def _prices(data: Any, path: Path) -> Prices:
    if not isinstance(data, dict):
        raise TypeError("not a prices file: expected a mapping")
    table = data.get("prices")
    if isinstance(table, dict):  # a gateway.yaml: its `models` are not prices
        return Prices.from_dict(table)
    return Prices.from_dict(data)
