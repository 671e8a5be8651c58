"""API keys managed live (issue 27): created, changed, revoked and rotated through the
admin API (`/admin/keys`, `gateway keys`), kept in Redis, honoured by every gateway
within a second. Tenants stay in tenants.yaml; a managed key belongs to one of them."""

from gateway.apikeys.key_directory import KeyDirectory
from gateway.apikeys.key_store import KeyStore
from gateway.apikeys.managed_key import KeyLimits, ManagedKey

__all__ = ["KeyDirectory", "KeyLimits", "KeyStore", "ManagedKey"]
