"""API key to tenant: the key's SHA-256 digest is looked up, the key itself is never kept."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from gateway.config import Tenant


class InvalidApiKey(Exception):
    """No key, a malformed `Authorization` header, or a key no tenant owns."""


@dataclass(frozen=True, slots=True)
class Identity:
    """Who is calling."""

    name: str
    tenant: Tenant
    # Which of the tenant's keys: the first 12 hex digits of its stored hash (not a
    # secret: tenants.yaml holds the whole hash), for the usage ledger.
    key_id: str = ""

    def may_use(self, model: str) -> bool:
        models = self.tenant.models
        return "*" in models or model in models


KEY_ID_DIGITS = 12


class Authenticator:
    """Maps `Authorization: Bearer KEY` to the tenant that owns KEY."""

    def __init__(
        self, tenants: Mapping[str, Tenant], tenant_by_key_hash: Mapping[str, str]
    ) -> None:
        self._by_digest = {
            digest: Identity(name, tenants[name], digest[:KEY_ID_DIGITS])
            for digest, name in tenant_by_key_hash.items()
        }

    def identify(self, authorization: str | None) -> Identity:
        """The caller's identity; `InvalidApiKey` if the header names none."""
        if not authorization:
            raise InvalidApiKey
        scheme, _, key = authorization.partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            raise InvalidApiKey
        identity = self._by_digest.get(hashlib.sha256(key.encode()).hexdigest())
        if identity is None:
            raise InvalidApiKey
        return identity
