"""Structured logs: JSON lines, and no secret survives any path into them."""

from __future__ import annotations

import logging
import sys

import orjson
import pytest

from gateway.observability.logging import JsonFormatter, RedactingFilter, redact

SECRETS = {
    "gateway key": "sk-acme-demo-1234567890",
    "project key": "sk-proj-AbCdEf0123456789",
    "bearer token": "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl",
    "aws key id": "AKIAIOSFODNN7EXAMPLE",
    "aws secret": "aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "github token": "ghp_16C7e42F292c6912E7710c838347Ae178B4a",
    "private key": (
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----"
    ),
    "url password": "redis://default:hunter2-secret@10.0.0.7:6379/0",
    "password field": "password=correct-horse-battery",
    "e-mail": "jane.doe@example.com",
}
# What must not be left of each secret after redaction.
LEFTOVERS = {
    "gateway key": "1234567890",
    "project key": "AbCdEf0123456789",
    "bearer token": "eyJhbGciOiJIUzI1NiJ9",
    "aws key id": "IOSFODNN7EXAMPLE",
    "aws secret": "wJalrXUtnFEMI",
    "github token": "16C7e42F292c6912",
    "private key": "MIIEowIBAAKCAQEA",
    "url password": "hunter2-secret",
    "password field": "correct-horse-battery",
    "e-mail": "jane.doe",
}


@pytest.mark.parametrize("name", sorted(SECRETS))
def test_every_known_secret_shape_is_redacted(name: str) -> None:
    clean = redact(f"context before {SECRETS[name]} and after")
    assert LEFTOVERS[name] not in clean
    assert "[REDACTED]" in clean
    assert clean.startswith("context before ")


def record(message: str, *args: object, **fields: object) -> logging.LogRecord:
    entry = logging.LogRecord("gateway.test", logging.WARNING, "f.py", 1, message, args, None)
    entry.fields = fields
    return entry


def test_json_lines_carry_fields_and_scrub_message_fields_and_exceptions() -> None:
    formatter = JsonFormatter()
    secrets = " ".join(SECRETS.values())
    entry = record("upstream said %s", secrets, tenant="acme", detail=[secrets], status=429)
    try:
        raise RuntimeError(f"failed with {SECRETS['url password']}")
    except RuntimeError:
        entry.exc_info = sys.exc_info()
    line = formatter.format(entry)
    data = orjson.loads(line)
    assert data["level"] == "warning"
    assert data["logger"] == "gateway.test"
    assert data["tenant"] == "acme" and data["status"] == 429
    assert data["ts"].endswith("Z")
    assert "\n" not in line
    for leftover in LEFTOVERS.values():
        assert leftover not in line


def test_plain_handlers_get_redacted_messages_too() -> None:
    entry = record("key %s", SECRETS["gateway key"])
    RedactingFilter().filter(entry)
    assert entry.getMessage() == "key [REDACTED]"
