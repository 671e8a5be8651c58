"""One managed API key: who owns it, what it may do, until when. Only the key's hash is
kept (`sha256:<hex>`, as tenants.yaml holds its keys); the plain key is shown once, when
it is made."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from gateway.config import Budget, hash_key

ID_PREFIX = "key_"
KEY_PREFIX = "sk-"
# Shown for a key in lists: its first characters and its last four (never enough to use).
SHOWN_PREFIX = 7


def new_key_id() -> str:
    """`key_` and 16 random hex digits."""
    return ID_PREFIX + secrets.token_hex(8)


def new_plain_key() -> str:
    """`sk-` and 32 URL-safe random characters (192 bits)."""
    return KEY_PREFIX + secrets.token_urlsafe(24)


def iso(seconds: float | None) -> str | None:
    """Epoch seconds as ISO 8601 in UTC (`2027-01-01T00:00:00Z`), None as None."""
    if seconds is None:
        return None
    text = datetime.fromtimestamp(seconds, UTC).isoformat()
    return text.replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class KeyLimits:
    """A key's own rates, on top of its tenant's: a request takes from both, so the
    lower of the two caps the key (the limiter's `KeyQuota`)."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None

    def to_json(self) -> dict[str, int | None]:
        return {
            "requests_per_minute": self.requests_per_minute,
            "tokens_per_minute": self.tokens_per_minute,
        }


@dataclass(frozen=True, slots=True)
class ManagedKey:
    """A key of the key store. Times are epoch seconds (UTC)."""

    id: str
    tenant: str
    name: str
    # `sha256:<64 hex>` of the plain key: never logged, never returned.
    key_hash: str
    # Shown instead of the key: `sk-AbCd…wXyZ`.
    prefix: str
    last4: str
    created_at: float
    # A subset of the tenant's models; None: all of the tenant's.
    models: tuple[str, ...] | None = None
    expires_at: float | None = None
    budget: Budget | None = None
    limits: KeyLimits = field(default_factory=KeyLimits)
    updated_at: float | None = None
    revoked_at: float | None = None
    # The tenant this key administers (its own): a scoped admin, who may manage that
    # tenant's keys and read its usage and stored responses, and nothing else of the
    # admin API (issue 40). Only a global admin sets it. None: not an admin (unless its
    # tenant is `admin: true` in tenants.yaml: then every key of it is a global admin).
    admin_of: str | None = None
    # `server/tool` patterns narrowing the MCP tools its tenant reaches (tenants.yaml
    # `mcp.tools`; `gateway.mcp.tool_reach`); None: all of the tenant's, (): none.
    mcp_tools: tuple[str, ...] | None = None

    @property
    def digest(self) -> str:
        """The hex SHA-256 of the key (what a request's key is looked up by)."""
        return self.key_hash.removeprefix("sha256:")

    def usable(self, now: float) -> bool:
        """Neither revoked nor expired at `now`."""
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)

    def with_secret(self, plain: str, now: float) -> ManagedKey:
        """The same key with a new secret (rotation): the old hash stops working."""
        return replace(
            self,
            key_hash=hash_key(plain),
            prefix=plain[:SHOWN_PREFIX],
            last4=plain[-4:],
            updated_at=now,
        )

    def public(self) -> dict[str, Any]:
        """What the admin API shows: everything but the hash."""
        return {
            "object": "api_key",
            "id": self.id,
            "tenant": self.tenant,
            "name": self.name,
            "display": f"{self.prefix}…{self.last4}",
            "models": None if self.models is None else list(self.models),
            "expires_at": iso(self.expires_at),
            "budget": None if self.budget is None else self.budget.model_dump(),
            "limits": self.limits.to_json(),
            "created_at": iso(self.created_at),
            "updated_at": iso(self.updated_at),
            "revoked_at": iso(self.revoked_at),
            "status": self.status(),
            "admin_of": self.admin_of,
            "mcp_tools": None if self.mcp_tools is None else list(self.mcp_tools),
        }

    def status(self, now: float | None = None) -> str:
        """`active`, `expired` or `revoked`."""
        if self.revoked_at is not None:
            return "revoked"
        now = datetime.now(UTC).timestamp() if now is None else now
        return "active" if self.usable(now) else "expired"

    def stored(self) -> dict[str, Any]:
        """The record as kept in Redis (JSON)."""
        return {
            "id": self.id,
            "tenant": self.tenant,
            "name": self.name,
            "key_hash": self.key_hash,
            "prefix": self.prefix,
            "last4": self.last4,
            "created_at": self.created_at,
            "models": None if self.models is None else list(self.models),
            "expires_at": self.expires_at,
            "budget": None if self.budget is None else self.budget.model_dump(),
            "limits": self.limits.to_json(),
            "updated_at": self.updated_at,
            "revoked_at": self.revoked_at,
            "admin_of": self.admin_of,
            "mcp_tools": None if self.mcp_tools is None else list(self.mcp_tools),
        }

    @classmethod
    def from_stored(cls, data: dict[str, Any]) -> ManagedKey:
        """A record `stored` wrote (raises on anything else)."""
        models = data.get("models")
        mcp_tools = data.get("mcp_tools")
        budget = data.get("budget")
        limits = data.get("limits") or {}
        return cls(
            id=str(data["id"]),
            tenant=str(data["tenant"]),
            name=str(data["name"]),
            key_hash=str(data["key_hash"]),
            prefix=str(data["prefix"]),
            last4=str(data["last4"]),
            created_at=float(data["created_at"]),
            models=None if models is None else tuple(str(m) for m in models),
            expires_at=_float_or_none(data.get("expires_at")),
            budget=None if budget is None else Budget.model_validate(budget),
            limits=KeyLimits(limits.get("requests_per_minute"), limits.get("tokens_per_minute")),
            updated_at=_float_or_none(data.get("updated_at")),
            revoked_at=_float_or_none(data.get("revoked_at")),
            # Records written before scoped admins have none: not admins.
            admin_of=None if data.get("admin_of") is None else str(data["admin_of"]),
            # Records written before MCP have none: all of the tenant's reach.
            mcp_tools=None if mcp_tools is None else tuple(str(t) for t in mcp_tools),
        )


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)
