"""The fields of a key's create or update, as the admin API receives them (JSON), each
checked: an unknown tenant, a model the tenant may not use, a negative or non-numeric
budget, an unknown period, an expiry in the past, a name too long... are each one
`KeyRequestInvalid` naming the field."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, get_args

from gateway.apikeys.errors import KeyRequestInvalid
from gateway.apikeys.managed_key import KeyLimits
from gateway.config import Budget, Tenant
from gateway.config.schema import MCP_PATTERN_CHARS, MCP_TOOLS_PATTERN, BudgetPeriod

MAX_NAME = 128
MAX_MODELS = 256
MAX_MCP_TOOLS = 256
MAX_MCP_PATTERN = MCP_PATTERN_CHARS
# 10000-01-01T00:00:00Z: later times cannot be written in ISO 8601 (nor by datetime).
LAST_EXPIRY = 253_402_300_800.0
# Far above any real limit; below where an integer would stop being one in JSON tools.
MAX_LIMIT = 10**12
MAX_AMOUNT = 10.0**12
PERIODS: tuple[str, ...] = get_args(BudgetPeriod)

CREATE_FIELDS = frozenset(
    {"tenant", "name", "models", "expires_at", "budget", "limits", "admin_of", "mcp_tools"}
)
UPDATE_FIELDS = CREATE_FIELDS - {"tenant"}


@dataclass(frozen=True, slots=True)
class KeyFields:
    """What a key is made with, or changed to (for an update: only the fields given are
    in `given`)."""

    name: str = ""
    models: tuple[str, ...] | None = None
    expires_at: float | None = None
    budget: Budget | None = None
    limits: KeyLimits = field(default_factory=KeyLimits)
    given: frozenset[str] = frozenset()
    # Which of `limits`' fields were given: an update changes those and keeps the rest
    # (`limits: null` clears both).
    limits_given: frozenset[str] = frozenset()
    # The tenant the key administers (its own), or None: not an admin. Who may set it
    # (a global admin only) is the admin API's check.
    admin_of: str | None = None
    # `server/tool` patterns narrowing the tenant's MCP tools; None: all of the tenant's.
    mcp_tools: tuple[str, ...] | None = None


def create_fields(
    data: Mapping[str, Any],
    tenants: Mapping[str, Tenant],
    known_models: Collection[str],
    now: float,
) -> tuple[str, KeyFields]:
    """(tenant, fields) of a `POST /admin/keys` body."""
    _no_unknown(data, CREATE_FIELDS)
    tenant_name = data.get("tenant")
    if not isinstance(tenant_name, str) or not tenant_name:
        raise KeyRequestInvalid("`tenant` must be a tenant's name.", "tenant")
    tenant = tenants.get(tenant_name)
    if tenant is None:
        raise KeyRequestInvalid(f"No tenant is named {_shown(tenant_name)!r}.", "tenant")
    if "name" not in data:
        raise KeyRequestInvalid("`name` is required.", "name")
    fields = _fields(data, tenant_name, tenant, known_models, now)
    return tenant_name, fields


def update_fields(
    data: Mapping[str, Any],
    tenant_name: str,
    tenant: Tenant,
    known_models: Collection[str],
    now: float,
) -> KeyFields:
    """The changes of a `PATCH /admin/keys/{id}` body (for a key of `tenant`)."""
    if "tenant" in data:
        raise KeyRequestInvalid("A key's tenant cannot be changed.", "tenant")
    _no_unknown(data, UPDATE_FIELDS)
    if not data:
        raise KeyRequestInvalid(
            "Nothing to change: give name, models, expires_at, budget, limits, admin_of or "
            "mcp_tools."
        )
    return _fields(data, tenant_name, tenant, known_models, now)


def _no_unknown(data: Mapping[str, Any], allowed: frozenset[str]) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise KeyRequestInvalid(
            f"Unknown field {_shown(unknown[0])!r}; expected some of {', '.join(sorted(allowed))}.",
            _shown(unknown[0]),
        )


def _fields(
    data: Mapping[str, Any],
    tenant_name: str,
    tenant: Tenant,
    known_models: Collection[str],
    now: float,
) -> KeyFields:
    name = _name(data["name"]) if "name" in data else ""
    models = _models(data.get("models"), tenant, known_models)
    budget = _budget(data.get("budget"), models, tenant, known_models)
    return KeyFields(
        name=name,
        models=models,
        expires_at=_expiry(data.get("expires_at"), now),
        budget=budget,
        limits=_limits(data.get("limits")),
        given=frozenset(data),
        limits_given=_limits_given(data.get("limits")),
        admin_of=_admin_of(data.get("admin_of"), tenant_name, tenant),
        mcp_tools=_mcp_tools(data.get("mcp_tools")),
    )


def _admin_of(value: Any, tenant_name: str, tenant: Tenant) -> str | None:
    """`admin_of`: null, or the key's own tenant (a key administers its own tenant)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise KeyRequestInvalid("`admin_of` must be the key's tenant's name, or null.", "admin_of")
    if value != tenant_name:
        raise KeyRequestInvalid(
            f"`admin_of` may only name the key's own tenant ({_shown(tenant_name)!r}), not "
            f"{_shown(value)!r}.",
            "admin_of",
        )
    if tenant.admin:
        raise KeyRequestInvalid(
            "Every key of an admin tenant (`admin: true`) is a global admin already: "
            "`admin_of` would not scope it.",
            "admin_of",
        )
    return value


def _shown(text: str, limit: int = 64) -> str:
    """A client's text quoted in an error, cut short."""
    return text if len(text) <= limit else text[:limit] + "…"


def _name(value: Any) -> str:
    if not isinstance(value, str):
        raise KeyRequestInvalid("`name` must be a string.", "name")
    if not value.strip():
        raise KeyRequestInvalid("`name` must not be empty.", "name")
    if len(value) > MAX_NAME:
        raise KeyRequestInvalid(f"`name` is longer than {MAX_NAME} characters.", "name")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise KeyRequestInvalid("`name` must not hold control characters.", "name")
    return value


def _tenant_may_use(tenant: Tenant, model: str, known_models: Collection[str]) -> bool:
    return model in known_models and ("*" in tenant.models or model in tenant.models)


def _models(value: Any, tenant: Tenant, known_models: Collection[str]) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(m, str) for m in value):
        raise KeyRequestInvalid("`models` must be a list of model names, or null.", "models")
    if not value:
        raise KeyRequestInvalid("`models` must name a model at least (null: all).", "models")
    if len(value) > MAX_MODELS:
        raise KeyRequestInvalid(f"`models` names more than {MAX_MODELS} models.", "models")
    for model in value:
        if not _tenant_may_use(tenant, model, known_models):
            raise KeyRequestInvalid(
                f"The tenant may not use the model {_shown(model)!r}: a key's models must "
                "be some of its tenant's.",
                "models",
            )
    return tuple(dict.fromkeys(value))


def _mcp_tools(value: Any) -> tuple[str, ...] | None:
    """`mcp_tools`: null (all of the tenant's MCP tools), or patterns narrowing them (an
    empty list: none)."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        raise KeyRequestInvalid(
            "`mcp_tools` must be a list of `server/tool` patterns, or null (all of the tenant's).",
            "mcp_tools",
        )
    if len(value) > MAX_MCP_TOOLS:
        raise KeyRequestInvalid(
            f"`mcp_tools` holds more than {MAX_MCP_TOOLS} patterns.", "mcp_tools"
        )
    for pattern in value:
        if not 0 < len(pattern) <= MAX_MCP_PATTERN:
            raise KeyRequestInvalid(
                f"Each of `mcp_tools` must be 1 to {MAX_MCP_PATTERN} characters.", "mcp_tools"
            )
        if MCP_TOOLS_PATTERN.fullmatch(pattern) is None:
            raise KeyRequestInvalid(
                f"{_shown(pattern)!r} is not an MCP tools pattern: `server/tool`, "
                "`server/*`, `server` or `*` (`*`, `?` and `[...]` match as in file names).",
                "mcp_tools",
            )
    return tuple(dict.fromkeys(value))


def _number(value: Any, param: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise KeyRequestInvalid(f"`{param}` must be a number.", param)
    if not math.isfinite(value):
        raise KeyRequestInvalid(f"`{param}` must be a finite number.", param)
    return float(value)


def _budget(
    value: Any,
    models: tuple[str, ...] | None,
    tenant: Tenant,
    known_models: Collection[str],
) -> Budget | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise KeyRequestInvalid(
            "`budget` must be an object {amount, period[, model]}, or null.", "budget"
        )
    unknown = sorted(set(value) - {"amount", "period", "model", "soft"})
    if unknown:
        raise KeyRequestInvalid(f"Unknown budget field {_shown(unknown[0])!r}.", "budget")
    if "amount" not in value:
        raise KeyRequestInvalid("`budget.amount` is required.", "budget.amount")
    amount = _number(value["amount"], "budget.amount")
    if amount < 0.000001:
        # Spend is counted in micro-units: a smaller budget would be none at all.
        raise KeyRequestInvalid(
            "`budget.amount` must be at least 0.000001 (one micro-unit).", "budget.amount"
        )
    if amount > MAX_AMOUNT:
        raise KeyRequestInvalid("`budget.amount` is too large.", "budget.amount")
    period = value.get("period", "month")
    if period not in PERIODS:
        raise KeyRequestInvalid(
            f"`budget.period` must be one of {', '.join(PERIODS)}.", "budget.period"
        )
    settings: dict[str, Any] = {"amount": amount, "period": period}
    model = value.get("model")
    if model is not None:
        if not isinstance(model, str):
            raise KeyRequestInvalid("`budget.model` must be a model name.", "budget.model")
        allowed = (models is None and _tenant_may_use(tenant, model, known_models)) or (
            models is not None and model in models
        )
        if not allowed:
            raise KeyRequestInvalid(
                f"The key may not use the model {_shown(model)!r}.", "budget.model"
            )
        settings["model"] = model
    if "soft" in value:
        soft = _number(value["soft"], "budget.soft")
        if not 0 < soft <= 1:
            raise KeyRequestInvalid("`budget.soft` must be in (0, 1].", "budget.soft")
        settings["soft"] = soft
    return Budget.model_validate(settings)


def parse_time(value: Any) -> float:
    """ISO 8601 (a date, or a time; UTC unless it says otherwise) or epoch seconds, as
    epoch seconds; ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError("not a time")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise ValueError("not a finite time")
        return float(value)
    if not isinstance(value, str) or len(value) > 64:
        raise ValueError("not a time")
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _expiry(value: Any, now: float) -> float | None:
    if value is None:
        return None
    try:
        moment = parse_time(value)
    except (ValueError, OverflowError, OSError):
        raise KeyRequestInvalid(
            "`expires_at` must be an ISO 8601 time (UTC unless it says), epoch seconds, or null.",
            "expires_at",
        ) from None
    if moment <= now:
        raise KeyRequestInvalid("`expires_at` is in the past.", "expires_at")
    if moment >= LAST_EXPIRY:
        raise KeyRequestInvalid("`expires_at` is past the year 9999.", "expires_at")
    return moment


def _limits_given(value: Any) -> frozenset[str]:
    if isinstance(value, dict):
        return frozenset(value)
    return frozenset(LIMIT_FIELDS)  # null: both cleared


LIMIT_FIELDS = ("requests_per_minute", "tokens_per_minute")


def _limits(value: Any) -> KeyLimits:
    if value is None:
        return KeyLimits()
    if not isinstance(value, dict):
        raise KeyRequestInvalid(
            "`limits` must be an object {requests_per_minute, tokens_per_minute}.", "limits"
        )
    found: dict[str, int | None] = {}
    for name in ("requests_per_minute", "tokens_per_minute"):
        amount = value.get(name)
        if amount is not None and (
            isinstance(amount, bool) or not isinstance(amount, int) or not 0 < amount <= MAX_LIMIT
        ):
            param = f"limits.{name}"
            raise KeyRequestInvalid(f"`{param}` must be a positive integer.", param)
        found[name] = amount
    unknown = sorted(set(value) - set(found))
    if unknown:
        raise KeyRequestInvalid(f"Unknown limits field {_shown(unknown[0])!r}.", "limits")
    return KeyLimits(found["requests_per_minute"], found["tokens_per_minute"])
