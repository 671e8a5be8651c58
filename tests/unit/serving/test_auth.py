"""API key lookup."""

from __future__ import annotations

import pytest

from gateway.api.errors import client_error
from gateway.config import Tenant, hash_key
from gateway.serving.auth import Authenticator, InvalidApiKey


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
