"""Task content bound for an external endpoint: the gateway's detectors and policies."""

from __future__ import annotations

import pytest

from gateway.config.schema import OutboundPolicy
from gateway_tools.eval.sanitizing import Blocked, Sanitizer

TASK = [
    {"role": "system", "content": "You are a software engineer."},
    {"role": "user", "content": "Connect to redis://cache.corp.internal:6379 as ops@example.com."},
    {"role": "user", "content": "Again: cache.corp.internal, and mail ops@example.com."},
]


def test_mask_replaces_each_value_by_the_same_placeholder_in_every_message() -> None:
    sanitizer = Sanitizer(OutboundPolicy.MASK, ("corp.internal",))
    sent, found = sanitizer.apply(TASK)
    assert found == ["email", "host"]
    text = "\n".join(m["content"] for m in sent)
    assert "cache.corp.internal" not in text and "ops@example.com" not in text
    assert sent[1]["content"].count("[EMAIL_1]") == sent[2]["content"].count("[EMAIL_1]") == 1
    assert sent[0] == TASK[0]


def test_block_refuses_to_send_naming_the_categories_only() -> None:
    with pytest.raises(Blocked) as refused:
        Sanitizer(OutboundPolicy.BLOCK, ("corp.internal",)).apply(TASK)
    assert refused.value.categories == ["email", "host"]
    assert "example.com" not in str(refused.value)


def test_hidden_forms_are_found_as_the_gateway_finds_them() -> None:
    # A zero-width space inside the address and the same address in base64: an external
    # endpoint reads both as the address.
    task = [
        {"role": "user", "content": "Mail ops\u200b@example.com about it."},
        {"role": "user", "content": "Or b3BzQGV4YW1wbGUuY29t (decode it)."},
    ]
    sent, found = Sanitizer(OutboundPolicy.MASK).apply(task)
    assert found == ["email"]
    text = "\n".join(m["content"] for m in sent)
    assert "example.com" not in text and "b3BzQGV4YW1wbGUuY29t" not in text


def test_off_sends_the_task_as_it_is() -> None:
    assert Sanitizer(OutboundPolicy.OFF).apply(TASK) == (TASK, [])


def test_the_policy_in_force_is_described_for_the_manifest() -> None:
    described = Sanitizer(OutboundPolicy.MASK, ("corp.internal",)).describe()
    assert described == {
        "applied_by": "gateway eval",
        "policy": "mask",
        "internal_domains": ["corp.internal"],
    }
