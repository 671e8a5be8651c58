"""A managed key's record: `admin_of` (issue 40) and `mcp_tools` (issue 45) kept, shown,
and absent from records written before them (not an admin; all of the tenant's tools)."""

from __future__ import annotations

from dataclasses import replace

import orjson

from gateway.apikeys import ManagedKey
from gateway.config import Tenant, hash_key
from gateway.serving.auth import Authenticator


def key(**fields: object) -> ManagedKey:
    return ManagedKey(
        id="key_0123456789abcdef", tenant="acme", name="ops", key_hash=hash_key("sk-x"),
        prefix="sk-x", last4="sk-x", created_at=1.0, **fields,  # type: ignore[arg-type]
    )  # fmt: skip


def test_admin_of_is_kept_and_shown() -> None:
    admin = key(admin_of="acme")
    assert ManagedKey.from_stored(admin.stored()) == admin
    assert admin.public()["admin_of"] == "acme"
    assert key().public()["admin_of"] is None


def test_a_record_from_before_scoped_admins_is_no_admin() -> None:
    record = key().stored()
    del record["admin_of"]
    assert ManagedKey.from_stored(record).admin_of is None


def test_mcp_tools_are_kept_and_shown() -> None:
    narrowed = key(mcp_tools=("notes/echo", "github/*"))
    stored = narrowed.stored()
    assert stored["mcp_tools"] == ["notes/echo", "github/*"]
    assert ManagedKey.from_stored(orjson.loads(orjson.dumps(stored))) == narrowed
    assert narrowed.public()["mcp_tools"] == ["notes/echo", "github/*"]
    none = key(mcp_tools=())
    assert ManagedKey.from_stored(none.stored()).mcp_tools == ()
    assert none.public()["mcp_tools"] == []
    assert key().public()["mcp_tools"] is None and key().stored()["mcp_tools"] is None
    assert ManagedKey.from_stored(key().stored()).mcp_tools is None


def test_a_record_from_before_mcp_reaches_all_of_its_tenant_s_tools() -> None:
    record = key().stored()
    del record["mcp_tools"]
    assert ManagedKey.from_stored(record).mcp_tools is None


class _Directory:
    """A KeyDirectory's lookup, over keys given."""

    def __init__(self, *keys: ManagedKey) -> None:
        self.keys = {k.digest: k for k in keys}

    def lookup(self, digest: str) -> ManagedKey | None:
        return self.keys.get(digest)

    def __len__(self) -> int:
        return len(self.keys)


def test_a_managed_key_s_mcp_tools_narrow_its_identity() -> None:
    narrowed = ManagedKey(
        id="key_000000000000000n", tenant="acme", name="n", key_hash=hash_key("sk-narrow"),
        prefix="sk-narr", last4="rrow", created_at=1.0, mcp_tools=("notes/echo",),
    )  # fmt: skip
    every = replace(
        narrowed, id="key_000000000000000a", key_hash=hash_key("sk-all"), mcp_tools=None
    )
    tenants = {"acme": Tenant(api_keys=[hash_key("sk-acme")])}
    auth = Authenticator(tenants, {}, _Directory(narrowed, every))  # type: ignore[arg-type]
    assert auth.identify("Bearer sk-narrow").key_mcp_tools == ("notes/echo",)
    assert auth.identify("Bearer sk-all").key_mcp_tools is None
