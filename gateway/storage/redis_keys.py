"""Redis key helpers shared by everything that keeps per-tenant state in Redis."""

from __future__ import annotations


def hash_tag(tenant: str) -> str:
    """The tenant name as a Redis Cluster hash tag body: no braces, never empty.

    `%`, `{` and `}` are percent-encoded, so distinct tenants get distinct tags and the
    first `}` of a key always closes the tag.
    """
    if not tenant:
        raise ValueError("tenant name must not be empty")
    return tenant.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")
