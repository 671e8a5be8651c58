"""Tenants and their GPU quotas, Kueue style: nominal quota, cohort borrowing, fair-share weight.

A tenant may always use its nominal quota. Beyond it, it borrows: only from a cohort (the
tenants that lend each other idle quota), at most its borrowing limit, and only while the
cohort's total use stays within the sum of the members' nominal quotas. Hard per-model caps
bound what it may hold of one GPU model, borrowed or not. Amounts are in thousandths of a
GPU. Pure, except `load_tenants`, which reads the YAML file.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gateway_control.scheduler.cluster import GPU_MILLI


@dataclass(frozen=True, slots=True)
class QuotaTenant:
    """One tenant's quota. `borrowing_limit_milli` None: no limit beyond the cohort's idle
    quota. `model_caps_milli`: hard caps per GPU model; models not listed are uncapped."""

    name: str
    quota_milli: int
    cohort: str = ""  # empty: a cohort of its own, so it never borrows
    borrowing_limit_milli: int | None = None
    weight: float = 1.0
    model_caps_milli: Mapping[str, int] = field(default_factory=dict)


class Quotas:
    """What each tenant and cohort holds, and whether a request of GPU fits the rules."""

    def __init__(self, tenants: Iterable[QuotaTenant]) -> None:
        self.tenants = {t.name: t for t in tenants}
        self.usage = dict.fromkeys(self.tenants, 0)
        self.model_usage: dict[str, dict[str, int]] = {name: {} for name in self.tenants}
        self._cohort = {t.name: t.cohort or f"\0{t.name}" for t in self.tenants.values()}
        self.cohort_nominal: dict[str, int] = {}
        self.cohort_usage: dict[str, int] = {}
        self.members: dict[str, list[str]] = {}
        for t in self.tenants.values():
            cohort = self._cohort[t.name]
            self.cohort_nominal[cohort] = self.cohort_nominal.get(cohort, 0) + t.quota_milli
            self.cohort_usage.setdefault(cohort, 0)
            self.members.setdefault(cohort, []).append(t.name)

    def cohort_of(self, tenant: str) -> str:
        """The tenant's cohort key (a private one for a tenant without a cohort)."""
        return self._cohort[tenant]

    def borrowed(self, tenant: str) -> int:
        """What the tenant holds beyond its nominal quota."""
        return max(0, self.usage[tenant] - self.tenants[tenant].quota_milli)

    def is_borrowing(self, tenant: str) -> bool:
        """Whether the tenant holds more than its nominal quota."""
        return self.usage[tenant] > self.tenants[tenant].quota_milli

    def share(self, tenant: str) -> tuple[float, float]:
        """Fair-share order key, lowest first: borrowed GPU per unit of weight, then held
        GPU per unit of weight (Kueue's share counts only borrowed resources)."""
        weight = self.tenants[tenant].weight
        return (self.borrowed(tenant) / weight, self.usage[tenant] / weight)

    def within_nominal(self, tenant: str, milli: int) -> bool:
        """Whether `milli` more stays within the tenant's nominal quota."""
        return self.usage[tenant] + milli <= self.tenants[tenant].quota_milli

    def admissible(self, tenant: str, milli: int) -> bool:
        """Whether the tenant may take `milli` more: the cohort's use must stay within the
        sum of its nominal quotas, and the tenant within its nominal quota or borrowing no
        more than its limit. (A tenant whose lent quota is in use gets it back by
        preempting the borrowers, not by overrunning the cohort.)"""
        if milli <= 0:
            return True
        cohort = self._cohort[tenant]
        if self.cohort_usage[cohort] + milli > self.cohort_nominal[cohort]:
            return False
        if self.within_nominal(tenant, milli):
            return True
        t = self.tenants[tenant]
        limit = t.borrowing_limit_milli
        return limit is None or self.usage[tenant] + milli - t.quota_milli <= limit

    def model_allowed(self, tenant: str, model: str, milli: int) -> bool:
        """Whether the tenant's cap on `model` (if any) leaves room for `milli` more."""
        cap = self.tenants[tenant].model_caps_milli.get(model)
        return cap is None or self.model_usage[tenant].get(model, 0) + milli <= cap

    def ceiling(self, tenant: str) -> int:
        """The most the tenant could ever hold (nominal plus what it may borrow)."""
        t = self.tenants[tenant]
        cohort_nominal = self.cohort_nominal[self._cohort[tenant]]
        if t.borrowing_limit_milli is None:
            return cohort_nominal
        return min(cohort_nominal, t.quota_milli + t.borrowing_limit_milli)

    def charge(self, tenant: str, model: str, milli: int) -> None:
        """Count `milli` of `model` as held by the tenant."""
        self.usage[tenant] += milli
        self.cohort_usage[self._cohort[tenant]] += milli
        models = self.model_usage[tenant]
        models[model] = models.get(model, 0) + milli

    def release(self, tenant: str, model: str, milli: int) -> None:
        """Undo `charge`."""
        self.charge(tenant, model, -milli)


def equal_tenants(
    names: Sequence[str], capacity_milli: int, cohort: str = "all"
) -> list[QuotaTenant]:
    """The default: the cluster's GPU split evenly into nominal quotas, all in one cohort,
    borrowing unlimited, equal weights."""
    if not names:
        return []
    each = capacity_milli // len(names)
    return [QuotaTenant(name, each, cohort) for name in sorted(names)]


def _milli(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"{what}: expected a non-negative number of GPUs, got {value!r}")
    return round(value * GPU_MILLI)


def tenants_from_mapping(document: Mapping[str, Any]) -> list[QuotaTenant]:
    """Tenants from the parsed YAML document:

    tenants:
      NAME: {gpus: 1500, cohort: main, borrowing_limit: 500, weight: 2, models: {V100M32: 64}}

    `gpus` is the nominal quota; `borrowing_limit` (GPUs) absent means unlimited; `models`
    are hard per-model caps in GPUs.
    """
    entries = document.get("tenants")
    if not isinstance(entries, Mapping) or not entries:
        raise ValueError("tenants: expected a non-empty mapping of tenant name to quota")
    tenants = []
    for name, spec in entries.items():
        if not isinstance(spec, Mapping):
            raise ValueError(f"tenant {name}: expected a mapping")
        unknown = set(spec) - {"gpus", "cohort", "borrowing_limit", "weight", "models"}
        if unknown:
            raise ValueError(f"tenant {name}: unknown keys {sorted(unknown)}")
        limit = spec.get("borrowing_limit")
        weight = spec.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, int | float) or weight <= 0:
            raise ValueError(f"tenant {name}: weight must be a positive number")
        models = spec.get("models") or {}
        if not isinstance(models, Mapping):
            raise ValueError(f"tenant {name}: models must map a GPU model to GPUs")
        tenants.append(
            QuotaTenant(
                name=str(name),
                quota_milli=_milli(spec.get("gpus"), f"tenant {name} gpus"),
                cohort=str(spec.get("cohort") or ""),
                borrowing_limit_milli=None
                if limit is None
                else _milli(limit, f"tenant {name} borrowing_limit"),
                weight=float(weight),
                model_caps_milli={
                    str(m): _milli(v, f"tenant {name} model {m}") for m, v in models.items()
                },
            )
        )
    return tenants


def load_tenants(path: str | Path) -> list[QuotaTenant]:
    """Tenants from a YAML file (see `tenants_from_mapping`)."""
    with open(path) as f:
        document = yaml.safe_load(f)
    if not isinstance(document, Mapping):
        raise ValueError(f"{path}: expected a mapping with a 'tenants' key")
    return tenants_from_mapping(document)
