"""API key to tenant: the key's SHA-256 digest is looked up, the key itself is never kept.

The keys of tenants.yaml are looked up first; then the managed keys (`gateway.apikeys`,
the admin API's `/admin/keys`), which a `KeyDirectory` keeps in memory."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass

from gateway.apikeys import KeyDirectory, ManagedKey
from gateway.config import Budget, Tenant
from gateway.ratelimit import KeyQuota


class InvalidApiKey(Exception):
    """No key, a malformed `Authorization` header, or a key no tenant owns (or one that
    is revoked or expired)."""


@dataclass(frozen=True, slots=True)
class Identity:
    """Who is calling."""

    name: str
    tenant: Tenant
    # Which of the tenant's keys: a managed key's id (`key_...`), or for a key of
    # tenants.yaml the first 12 hex digits of its stored hash (not a secret: tenants.yaml
    # holds the whole hash), for the usage ledger.
    key_id: str = ""
    # A managed key's own caps (`gateway keys`: its budget, its lower rates), beside
    # the tenant's (None for a key of tenants.yaml, or a managed key without any).
    key_quota: KeyQuota | None = None
    # A managed key's models, a subset of the tenant's (None: all of the tenant's).
    key_models: frozenset[str] | None = None
    # A managed key's name ("" for a key of tenants.yaml).
    key_name: str = ""
    # The tenant a managed key administers (its own; `ManagedKey.admin_of`), else None.
    admin_of: str | None = None
    # A managed key's MCP tools (`server/tool` patterns), narrowing its tenant's (None:
    # the tenant's).
    key_mcp_tools: tuple[str, ...] | None = None

    @property
    def key_budgets(self) -> tuple[Budget, ...]:
        """The key's own budgets (none for a key of tenants.yaml)."""
        return () if self.key_quota is None else self.key_quota.budgets

    @property
    def admin_scope(self) -> str | None:
        """The tenant whose part of the admin API this caller may use, "*" for all of it
        (a key of an `admin: true` tenant), None for none of it."""
        if self.tenant.admin:
            return "*"
        return self.admin_of if self.admin_of == self.name else None

    def may_use(self, model: str) -> bool:
        if self.key_models is not None and model not in self.key_models:
            return False
        models = self.tenant.models
        return "*" in models or model in models


KEY_ID_DIGITS = 12
# The owner of what a caller without a key id stores (none is made so by the gateway).
_NO_KEY_ID = "tenant"


def owner_of(identity: Identity) -> str:
    """Who owns what the caller stores (a stored response, an Idempotency-Key record):
    its API key, by key id: a managed key's `key_...` (kept through rotations), or for
    a key of tenants.yaml the first 12 hex digits of its hash (a new key there is a new
    owner). Another key of the same tenant is another owner (issue 40)."""
    return identity.key_id or _NO_KEY_ID


class Authenticator:
    """Maps `Authorization: Bearer KEY` to the tenant that owns KEY."""

    def __init__(
        self,
        tenants: Mapping[str, Tenant],
        tenant_by_key_hash: Mapping[str, str],
        directory: KeyDirectory | None = None,
    ) -> None:
        self._tenants = tenants
        self._by_digest = {
            digest: Identity(name, tenants[name], digest[:KEY_ID_DIGITS])
            for digest, name in tenant_by_key_hash.items()
        }
        self._directory = directory
        # Managed keys' identities, made once per record (a change loads a new record).
        self._managed: dict[str, tuple[ManagedKey, Identity | None]] = {}

    def identify(self, authorization: str | None) -> Identity:
        """The caller's identity; `InvalidApiKey` if the header names none."""
        digest = _digest(authorization)
        identity = self._by_digest.get(digest)
        if identity is None:
            identity = self._managed_identity(digest)
        if identity is None:
            raise InvalidApiKey
        return identity

    def identity_of(self, tenant: str, key_id: str) -> Identity:
        """The identity of `tenant`'s key `key_id` as it is now (a batch's lines run as
        the key that made the batch, long after its request); `InvalidApiKey` once that
        key is gone, revoked or expired, or no longer the tenant's."""
        for listed in self._by_digest.values():
            if listed.key_id == key_id and listed.name == tenant:
                return listed
        key = None if self._directory is None else self._directory.by_id(key_id)
        managed = None if key is None else self._managed_identity(key.digest)
        if managed is None or managed.name != tenant:
            raise InvalidApiKey
        return managed

    async def authenticate(self, authorization: str | None) -> Identity:
        """`identify`, but a key unknown here is looked for once more in the store (a key
        made an instant ago on another gateway); every caller meanwhile shares the look."""
        digest = _digest(authorization)
        identity = self._by_digest.get(digest)
        if identity is not None:
            return identity
        identity = self._managed_identity(digest)
        if identity is not None:
            return identity
        directory = self._directory
        if directory is None or directory.lookup(digest) is not None:
            raise InvalidApiKey  # no store, or a key known and refused (revoked, expired)
        # A key made an instant ago: a look that started before it was made would miss it.
        await directory.refresh_from_now()
        identity = self._managed_identity(digest)
        if identity is None:
            raise InvalidApiKey
        return identity

    def _managed_identity(self, digest: str) -> Identity | None:
        if self._directory is None:
            return None
        key = self._directory.lookup(digest)
        if key is None or not key.usable(time.time()):
            return None
        cached = self._managed.get(digest)
        if cached is not None and cached[0] is key:
            return cached[1]
        tenant = self._tenants.get(key.tenant)
        identity = None
        if tenant is not None:  # a key of a tenant tenants.yaml no longer has: refused
            identity = Identity(
                key.tenant,
                tenant,
                key.id,
                key_quota=_quota(key),
                key_models=None if key.models is None else frozenset(key.models),
                key_name=key.name,
                admin_of=key.admin_of,
                key_mcp_tools=None if key.mcp_tools is None else tuple(key.mcp_tools),
            )
        if len(self._managed) > 4 * len(self._directory) + 64:
            self._managed.clear()  # records replaced: forget the old ones
        self._managed[digest] = (key, identity)
        return identity


def _digest(authorization: str | None) -> str:
    if not authorization:
        raise InvalidApiKey
    scheme, _, key = authorization.partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
        raise InvalidApiKey
    return hashlib.sha256(key.encode()).hexdigest()


def _quota(key: ManagedKey) -> KeyQuota | None:
    """The caps a managed key adds to its tenant's (None: it adds none)."""
    quota = KeyQuota(
        key.id,
        () if key.budget is None else (key.budget,),
        key.limits.requests_per_minute,
        key.limits.tokens_per_minute,
    )
    return None if quota.empty else quota
