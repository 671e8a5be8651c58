"""API key lookup."""

from __future__ import annotations

import time
from typing import Any

import pytest

from gateway.api.errors import client_error
from gateway.apikeys import ManagedKey
from gateway.apikeys.managed_key import KeyLimits
from gateway.config import Budget, Tenant, hash_key
from gateway.ratelimit import KeyQuota
from gateway.serving.auth import Authenticator, InvalidApiKey, owner_of


def tenant(*models: str) -> Tenant:
    return Tenant(api_keys=[hash_key("k")], models=list(models))


def test_bearer_key_maps_to_its_tenant() -> None:
    digest = hash_key("sk-acme").removeprefix("sha256:")
    auth = Authenticator({"acme": tenant("m1")}, {digest: "acme"})
    identity = auth.identify("Bearer sk-acme")
    assert identity.name == "acme"
    assert identity.may_use("m1") and not identity.may_use("m2")
    assert auth.identify("bearer  sk-acme").name == "acme"


@pytest.mark.parametrize("header", [None, "", "Bearer", "Basic sk-acme", "Bearer sk-other"])
def test_missing_or_unknown_key_is_401(header: str | None) -> None:
    digest = hash_key("sk-acme").removeprefix("sha256:")
    auth = Authenticator({"acme": tenant("*")}, {digest: "acme"})
    with pytest.raises(InvalidApiKey) as caught:
        auth.identify(header)
    assert client_error(caught.value).status == 401


def test_wildcard_allows_every_model() -> None:
    digest = hash_key("k").removeprefix("sha256:")
    assert Authenticator({"t": tenant("*")}, {digest: "t"}).identify("Bearer k").may_use("any")


class _Directory:
    """A KeyDirectory's lookup, over keys given."""

    def __init__(self, *keys: ManagedKey) -> None:
        self.keys = {key.digest: key for key in keys}
        self.refreshes = 0

    def lookup(self, digest: str) -> ManagedKey | None:
        return self.keys.get(digest)

    def __len__(self) -> int:
        return len(self.keys)

    async def refresh_from_now(self) -> None:
        self.refreshes += 1


def managed(plain: str, tenant: str = "acme", **fields: Any) -> ManagedKey:
    return ManagedKey(
        id="key_" + plain[-4:].rjust(16, "0"), tenant=tenant, name="ci",
        key_hash=hash_key(plain), prefix=plain[:7], last4=plain[-4:],
        created_at=time.time(), **fields,
    )  # fmt: skip


def test_a_managed_key_is_its_tenant_with_its_own_models_and_budget() -> None:
    budget = Budget(amount=0.05, period="day")
    key = managed("sk-managed-1", models=("m1",), budget=budget)
    directory = _Directory(key)
    auth = Authenticator({"acme": tenant("m1", "m2")}, {}, directory)  # type: ignore[arg-type]
    identity = auth.identify("Bearer sk-managed-1")
    assert (identity.name, identity.key_id, identity.key_name) == ("acme", key.id, "ci")
    assert identity.key_budgets == (budget,) and identity.key_models == frozenset({"m1"})
    assert identity.key_quota is not None and identity.key_quota.key_id == key.id
    assert identity.may_use("m1") and not identity.may_use("m2")
    assert auth.identify("Bearer sk-managed-1") is identity  # made once per record


def test_a_managed_keys_own_rates_go_to_the_limiter_and_a_key_without_caps_adds_none() -> None:
    capped = managed("sk-managed-3", limits=KeyLimits(requests_per_minute=5))
    plain = managed("sk-managed-4")
    auth = Authenticator({"acme": tenant("*")}, {}, _Directory(capped, plain))  # type: ignore[arg-type]
    quota = auth.identify("Bearer sk-managed-3").key_quota
    assert quota == KeyQuota(capped.id, (), requests_per_minute=5, tokens_per_minute=None)
    assert auth.identify("Bearer sk-managed-4").key_quota is None


@pytest.mark.parametrize(
    "key",
    [
        managed("sk-managed-2", expires_at=time.time() - 1),
        managed("sk-managed-2", revoked_at=time.time() - 1),
        managed("sk-managed-2", tenant="gone"),  # a tenant no longer in tenants.yaml
    ],
)
async def test_expired_revoked_or_orphaned_managed_keys_are_401(key: ManagedKey) -> None:
    directory = _Directory(key)
    auth = Authenticator({"acme": tenant("*")}, {}, directory)  # type: ignore[arg-type]
    with pytest.raises(InvalidApiKey) as caught:
        auth.identify("Bearer sk-managed-2")
    assert client_error(caught.value).status == 401
    with pytest.raises(InvalidApiKey):
        await auth.authenticate("Bearer sk-managed-2")


async def test_an_unknown_key_looks_in_the_store_once_more() -> None:
    directory = _Directory()
    auth = Authenticator({"acme": tenant("*")}, {}, directory)  # type: ignore[arg-type]
    with pytest.raises(InvalidApiKey):
        await auth.authenticate("Bearer sk-unknown")
    assert directory.refreshes == 1
    with pytest.raises(InvalidApiKey):
        await auth.authenticate("Basic sk-unknown")  # malformed: no look
    assert directory.refreshes == 1
    key = managed("sk-managed-3")
    directory.keys[key.digest] = key
    assert (await auth.authenticate("Bearer sk-managed-3")).key_id == key.id


def test_each_key_of_a_tenant_is_its_own_owner() -> None:
    # Issue 40: what a key stores (responses, Idempotency-Key records) is that key's.
    first, second = hash_key("sk-one").removeprefix("sha256:"), hash_key("sk-two")[7:]
    key = managed("sk-managed-1")
    auth = Authenticator(
        {"acme": tenant("*")},
        {first: "acme", second: "acme"},
        _Directory(key),  # type: ignore[arg-type]
    )
    owners = [owner_of(auth.identify(f"Bearer {k}")) for k in ("sk-one", "sk-two", "sk-managed-1")]
    assert owners == [first[:12], second[:12], key.id]
    # A managed key keeps its id, so its owner, when it is rotated.
    rotated = key.with_secret("sk-managed-new", time.time())
    again = Authenticator({"acme": tenant("*")}, {}, _Directory(rotated))  # type: ignore[arg-type]
    assert owner_of(again.identify("Bearer sk-managed-new")) == key.id
