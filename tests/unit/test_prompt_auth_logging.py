"""Prompt templates, API key lookup and log redaction."""

from __future__ import annotations

import logging

import pytest
from jinja2.exceptions import SecurityError

from gateway.api.errors import client_error
from gateway.config import Tenant, hash_key
from gateway.inference.prompt import PromptTemplate, template_problem
from gateway.inference.types import ChatMessage
from gateway.observability.logging import RedactingFilter, redact
from gateway.serving.auth import Authenticator, InvalidApiKey

MESSAGES = [ChatMessage("system", "Be brief."), ChatMessage("user", "Hi")]


def test_chatml_template_ends_where_the_assistant_answers() -> None:
    assert PromptTemplate("chatml").render(MESSAGES) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_custom_jinja_template_and_sandbox() -> None:
    template = PromptTemplate("{% for m in messages %}[{{ m.role }}] {{ m.content }} {% endfor %}>")
    assert template.render(MESSAGES) == "[system] Be brief. [user] Hi >"
    with pytest.raises(SecurityError):
        PromptTemplate("{{ messages[0].__class__.__mro__ }}").render(MESSAGES)


def test_broken_template_is_reported() -> None:
    assert template_problem("chatml") is None
    problem = template_problem("{% for m in messages %}")
    assert problem is not None and problem.startswith("prompt_template does not compile")


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


def test_keys_are_redacted_from_log_lines() -> None:
    assert redact("Authorization: Bearer abc.def") == "Authorization: Bearer [REDACTED]"
    assert redact("key sk-acme-demo leaked") == "key [REDACTED] leaked"
    record = logging.LogRecord("x", logging.INFO, "f", 1, "got %s", ("sk-secret-123",), None)
    RedactingFilter().filter(record)
    assert record.getMessage() == "got [REDACTED]"
