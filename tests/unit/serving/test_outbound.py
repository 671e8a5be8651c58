"""Outbound sanitization: what a request to an external model may carry (policies per
tenant and per model, masking, blocking, counting and the audit line)."""

from __future__ import annotations

import base64
import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import pytest

from gateway.config import Config, GatewayConfig, ModelConfig, Tenant, TenantsConfig
from gateway.inference.types import (
    ChatMessage,
    ChatOptions,
    InferenceRequest,
    RequestKind,
    SamplingParams,
    Tool,
    ToolCall,
)
from gateway.observability import metrics
from gateway.serving.outbound import OutboundGuard, SensitiveDataBlocked

SECRET_TEXT = "Mail jane@example.com the key sk-live-abcdef123456 for db1.corp.example.com"


def model(**settings: Any) -> ModelConfig:
    return ModelConfig.model_validate(
        {"backend": "openai", "replicas": [{"url": "http://x"}], **settings}
    )


def config(models: dict[str, ModelConfig], **tenant: Any) -> Config:
    gateway = GatewayConfig(models=models, outbound={"internal_domains": ["corp.example.com"]})
    tenants = TenantsConfig(tenants={"acme": Tenant.model_validate({"api_keys": ["x"], **tenant})})
    return Config(
        gateway=gateway, tenants=tenants, tenant_by_key_hash={}, gateway_path="", tenants_path=""
    )


def chat(*texts: str) -> InferenceRequest:
    messages = tuple(
        ChatMessage("user" if i % 2 == 0 else "assistant", t) for i, t in enumerate(texts)
    )
    return InferenceRequest(RequestKind.CHAT, "m", SamplingParams(max_tokens=8), messages=messages)


def prepare(cfg: Config, chain: list[str], request: InferenceRequest) -> Any:
    tenant = cfg.tenants.tenants["acme"]
    return OutboundGuard(cfg).prepare("acme", tenant, chain, request, "chatcmpl-1")


def test_nothing_is_touched_when_no_model_is_external() -> None:
    cfg = config({"local": model()})
    assert prepare(cfg, ["local"], chat(SECRET_TEXT)) is None


def test_an_external_model_gets_every_finding_masked_consistently() -> None:
    cfg = config({"hosted": model(external=True)})
    request = chat(SECRET_TEXT, "Noted: jane@example.com.", "And +49 30 1234567?")
    outbound = prepare(cfg, ["hosted"], request)
    sent = outbound.requests[0]
    assert [m.content for m in sent.messages] == [
        "Mail [EMAIL_1] the key [API_KEY_1] for [HOST_1]",
        "Noted: [EMAIL_1].",
        "And [PHONE_1]?",
    ]
    assert [m.role for m in sent.messages] == ["user", "assistant", "user"]
    assert request.messages[0].content == SECRET_TEXT  # the client's request is not changed


def test_a_completion_prompt_is_masked_too() -> None:
    cfg = config({"hosted": model(external=True)})
    request = InferenceRequest(
        RequestKind.COMPLETION, "hosted", SamplingParams(max_tokens=8), prompt=SECRET_TEXT
    )
    assert prepare(cfg, ["hosted"], request).requests[0].prompt == (
        "Mail [EMAIL_1] the key [API_KEY_1] for [HOST_1]"
    )


def test_block_refuses_naming_the_categories_never_the_values() -> None:
    cfg = config({"hosted": model(external=True, outbound="block")})
    with pytest.raises(SensitiveDataBlocked) as refused:
        prepare(cfg, ["hosted"], chat(SECRET_TEXT))
    assert refused.value.model == "hosted"
    assert refused.value.categories == ["api_key", "email", "host"]
    assert "jane" not in str(refused.value) and "abcdef" not in str(refused.value)
    # Clean text passes a blocking policy.
    assert prepare(cfg, ["hosted"], chat("What is 2 + 2?")).requests[0].messages[0].content == (
        "What is 2 + 2?"
    )


def test_a_blocking_fallback_is_left_out_of_the_chain() -> None:
    cfg = config({"local": model(), "hosted": model(external=True, outbound="block")})
    outbound = prepare(cfg, ["local", "hosted"], chat(SECRET_TEXT))
    assert outbound.models == ["local"]
    assert outbound.requests[0].messages[0].content == SECRET_TEXT  # local: as it came


def test_the_tenant_policy_replaces_the_model_policy() -> None:
    models = {"hosted": model(external=True), "other": model(external=True)}
    blocked = config(models, outbound={"policy": "block", "models": {"other": False}})
    with pytest.raises(SensitiveDataBlocked):
        prepare(blocked, ["hosted"], chat(SECRET_TEXT))
    # `off` for one model (YAML's unquoted `off` reads as false, and means off): None,
    # the request goes as it is.
    assert prepare(blocked, ["other"], chat(SECRET_TEXT)) is None
    mixed = prepare(blocked, ["other", "hosted"], chat("Write to jane@example.com"))
    assert mixed.models == ["other"]  # hosted blocks it
    assert mixed.requests[0].messages[0].content == "Write to jane@example.com"


def test_findings_are_counted_and_audited_without_values(caplog: pytest.LogCaptureFixture) -> None:
    cfg = config({"counted": model(external=True)})
    counter = metrics.OUTBOUND_FINDINGS.labels("counted", "email", "mask")
    before = counter._value.get()
    with caplog.at_level(logging.INFO, logger="gateway.audit"):
        prepare(cfg, ["counted"], chat(SECRET_TEXT, "cc jane@example.com"))
    assert counter._value.get() - before == 2
    (record,) = [r for r in caplog.records if r.name == "gateway.audit"]
    fields = record.fields  # type: ignore[attr-defined]
    assert fields["model"] == "counted" and fields["policy"] == "mask"
    assert fields["findings"] == [
        {"category": "api_key", "count": 1},
        {"category": "email", "count": 2},
        {"category": "host", "count": 1},
    ]
    assert "jane" not in repr(record.__dict__) and "abcdef" not in repr(record.__dict__)


AWS = "AKIAIOSFODNN7EXAMPLE"


@dataclass(frozen=True)
class ApiState:
    """What an API keeps for its answer (`wire_state`), as the Responses API does."""

    metadata: dict[str, str]
    conversation: tuple[ChatMessage, ...] = ()


def test_tools_calls_results_stops_ids_and_user_are_masked_consistently() -> None:
    cfg = config({"hosted": model(external=True)})
    schema = {
        "type": "object",
        "properties": {"owner": {"type": "string", "enum": ["nobody", "jane@example.com"]}},
    }
    call = ToolCall(f"call_{AWS}", "lookup", '{"owner": "jane@example.com"}')
    request = dataclasses.replace(
        chat("Find the owner"),
        messages=(
            ChatMessage("user", "Find the owner"),
            ChatMessage("assistant", "", tool_calls=(call,)),
            ChatMessage("tool", f"Owner: jane@example.com, key {AWS}", tool_call_id=call.id),
        ),
        params=SamplingParams(max_tokens=8, stop=("jane@example.com",)),
        options=ChatOptions(tools=(Tool("lookup", f"Sign with {AWS}", schema),)),
        user="jane@example.com",
    )
    sent = prepare(cfg, ["hosted"], request).requests[0]
    tool = sent.options.tools[0]
    assert tool.description == "Sign with [API_KEY_1]"
    assert tool.parameters == {
        "type": "object",
        "properties": {"owner": {"type": "string", "enum": ["nobody", "[EMAIL_1]"]}},
    }
    masked_call = sent.messages[1].tool_calls[0]
    assert masked_call.arguments == '{"owner": "[EMAIL_1]"}'
    # The call id is masked as the same placeholder where its result names it.
    assert masked_call.id == sent.messages[2].tool_call_id == "call_[API_KEY_1]"
    assert sent.messages[2].content == "Owner: [EMAIL_1], key [API_KEY_1]"
    assert sent.params.stop == ("[EMAIL_1]",) and sent.user == "[EMAIL_1]"
    assert sent.model == request.model  # not the client's data, and never sent


def test_a_value_under_a_secret_name_is_masked_whatever_it_looks_like() -> None:
    cfg = config({"hosted": model(external=True)})
    state = ApiState({"db_password": "hunter2", "note": "fine"})
    sent = prepare(cfg, ["hosted"], dataclasses.replace(chat("Hi"), wire_state=state))
    assert sent.requests[0].wire_state == ApiState({"db_password": "[PASSWORD_1]", "note": "fine"})


def test_block_names_what_any_field_and_any_form_holds() -> None:
    cfg = config({"hosted": model(external=True, outbound="block")})
    hidden = dataclasses.replace(
        chat("Hi"),
        user="jane@ex\u0430mple.com",
        wire_state=ApiState({"note": base64.b64encode(AWS.encode()).decode()}),
        params=SamplingParams(max_tokens=8, stop=("4111.1111.1111.1111",)),
    )
    with pytest.raises(SensitiveDataBlocked) as refused:
        prepare(cfg, ["hosted"], hidden)
    assert refused.value.categories == ["api_key", "card", "email"]


def test_an_object_held_twice_is_counted_once() -> None:
    cfg = config({"twice": model(external=True)})
    message = ChatMessage("user", "mail jane@example.com")
    request = dataclasses.replace(
        chat("x"), messages=(message,), wire_state=ApiState({}, conversation=(message,))
    )
    counter = metrics.OUTBOUND_FINDINGS.labels("twice", "email", "mask")
    before = counter._value.get()
    prepare(cfg, ["twice"], request)
    assert counter._value.get() - before == 1


# What web tools write (issue 40): a presigned-style URL, a page's HTML, a table.
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
WEB_FORMS = (
    f"GET https://host/x?aws_access_key_id={AWS}&q={AWS_SECRET.replace('/', '%2F')}&x=1",
    f"<td>key</td><td>{AWS_SECRET.replace('/', '&#x2F;')}</td>, {AWS_SECRET.replace('/', '&sol;')}",
    "card 4111 1111\n1111 1111, on file as:\n| 4111 | 1111 | 1111 | 1111 |",
    "or 4111-1111-\n1111-1111",
)


def test_encoded_and_split_values_are_masked_whole_for_an_external_model() -> None:
    cfg = config({"hosted": model(external=True)})
    call = ToolCall(
        "call_1", "fetch", '{"url": "https:\\/\\/host\\/?q=' + AWS_SECRET.replace("/", "\\/") + '"}'
    )
    base = chat(*WEB_FORMS)
    call_message = ChatMessage("assistant", "", tool_calls=(call,))
    request = dataclasses.replace(base, messages=(*base.messages, call_message))
    sent = prepare(cfg, ["hosted"], request).requests[0]
    assert [m.content for m in sent.messages[:4]] == [
        "GET https://host/x?aws_access_key_id=[API_KEY_1]&q=[API_KEY_2]&x=1",
        "<td>key</td><td>[API_KEY_2]</td>, [API_KEY_2]",
        "card [CARD_1], on file as:\n| [CARD_1] |",
        "or [CARD_1]",
    ]
    assert (
        sent.messages[4].tool_calls[0].arguments == '{"url": "https:\\/\\/host\\/?q=[API_KEY_2]"}'
    )
    # No piece of the secret or the card is left anywhere in what is sent.
    for piece in ("wJalr", "K7MDENG", "bPxRfiCY", "1111"):
        assert piece not in repr(sent.messages)


def test_encoded_and_split_values_are_refused_by_block() -> None:
    cfg = config({"hosted": model(external=True, outbound="block")})
    for text, categories in [
        (f"see https://host/x?q={AWS_SECRET.replace('/', '%2F')}&x=1", ["api_key"]),
        (f"key {AWS_SECRET.replace('/', '&amp;#47;')}", ["api_key"]),
        ("<td>4111</td><td>1111</td><td>1111</td><td>1111</td>", ["card"]),
        # Grouped with dashes, a dash on either side of a line break (the second
        # hostile review of issue 40: block answered 200 and sent it).
        ("card 4111-1111-\n1111-1111", ["card"]),
        ("card 4111-1111\n-1111-1111", ["card"]),
    ]:
        with pytest.raises(SensitiveDataBlocked) as refused:
            prepare(cfg, ["hosted"], chat(text))
        assert refused.value.categories == categories
    # Numbers on two lines that are no card pass.
    clean = "We shipped 4111 1111\n1111 1112 units."
    assert prepare(cfg, ["hosted"], chat(clean)).requests[0].messages[0].content == clean
