"""A managed key's record: `admin_of` (issue 40) kept, shown, and absent from records
written before it (not an admin)."""

from __future__ import annotations

from gateway.apikeys import ManagedKey
from gateway.config import hash_key


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
