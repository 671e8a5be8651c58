"""Structured logs: JSON lines, and no secret survives any path into them."""

from __future__ import annotations

import asyncio
import io
import logging
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field

import orjson
import pytest

from gateway.api import errors
from gateway.observability.logging import (
    SCRUBBED,
    BatchingStreamHandler,
    JsonFormatter,
    RedactingFilter,
    redact,
)
from tests.unit.observability.secret_samples import ALL_SECRETS, SECRETS, leftovers_in

# Text without a secret: redaction must leave it exactly as it is.
NORMAL_TEXT = [
    "llama-3.1-8b-instruct deepseek-r1-distill-qwen-7b gpt-4o-mini mistral-7b-instruct",
    "https://api.openai.com/v1/chat/completions http://10.0.0.7:8000/v1/models?limit=10",
    "redis://redis.internal:6379/0 grpc://triton:8001",
    "prompt_tokens=512 completion_tokens=128 max_tokens: 1024 status=200 duration_ms=1234.56",
    "req_01J9ZK3QW8X4T2M6N7P5R chatcmpl-9f8e7d6c5b4a task-queue disk-cache network-policy",
    "Rate limit reached for tokens per minute; retry after the indicated time.",
    "A request with this Idempotency-Key is still running; retry later.",
    errors.invalid_api_key().message,
    "GET /v1/models -> 200 in 3.2 ms, 42 replicas, 99.9% healthy",
    # A port and an `@` later in the path are not a password.
    "https://api.example.com:443/models/foo@v2 docker://registry:5000/img@sha256:0a1b",
    "http://[::1]:8000/v1@x",
    # 40-character runs that are not AWS secrets: a git hash, a config digest, a path.
    "commit 9fceb02d0ae598e95dc970b74767f19372d61af8",
    "config b3f1c0ffee0ddba11deadbeef00112233445566",
    "/usr/lib/python3.11/site-packages/gateway/observability/logging.py",
    "Password policies, passwords and pwds are words; so are tokens and keys.",
]


@pytest.mark.parametrize("name", sorted(SECRETS))
def test_every_known_secret_shape_is_redacted(name: str) -> None:
    secret, leftovers = SECRETS[name]
    clean = redact(f"context before {secret} and after")
    for leftover in leftovers:
        assert leftover not in clean
    assert "[REDACTED]" in clean
    assert clean.startswith("context before ")
    assert redact(clean) == clean  # redacting again changes nothing


def test_every_secret_shape_is_redacted_in_one_text() -> None:
    assert leftovers_in(redact(ALL_SECRETS)) == []


def test_redaction_keeps_the_shape_of_what_it_redacts() -> None:
    json = '{"password": "a b", "user": "bob"}'
    assert redact(json) == '{"password": "[REDACTED]", "user": "bob"}'
    assert redact("redis://:pw@host:6379/0") == "redis://:[REDACTED]@host:6379/0"
    assert redact("Authorization: Bearer abc.def") == "Authorization: Bearer [REDACTED]"
    assert redact("sp=r&sig=AbC%3D&se=1") == "sp=r&sig=[REDACTED]&se=1"


@pytest.mark.parametrize("text", NORMAL_TEXT)
def test_normal_text_is_not_altered(text: str) -> None:
    assert redact(text) == text


def record(message: str, *args: object, **fields: object) -> logging.LogRecord:
    entry = logging.LogRecord("gateway.test", logging.WARNING, "f.py", 1, message, args, None)
    entry.fields = fields
    return entry


def test_json_lines_carry_fields_and_scrub_message_fields_and_exceptions() -> None:
    formatter = JsonFormatter()
    entry = record("upstream said %s", ALL_SECRETS, tenant="acme", detail=[ALL_SECRETS], status=429)
    try:
        raise RuntimeError(f"failed with {SECRETS['url password'][0]}")
    except RuntimeError:
        entry.exc_info = sys.exc_info()
    line = formatter.format(entry)
    data = orjson.loads(line)
    assert data["level"] == "warning"
    assert data["logger"] == "gateway.test"
    assert data["tenant"] == "acme" and data["status"] == 429
    assert data["ts"].endswith("Z")
    assert "\n" not in line
    assert leftovers_in(line) == []


@dataclass
class Credentials:
    user: str
    password: str = field(repr=False)


@pytest.fixture
def json_log() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A logger writing through the handler and formatter `configure_logging` installs."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("gateway.test.redaction")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    yield logger, stream
    logger.handlers.clear()


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in stream.getvalue().splitlines()]


def test_logged_fields_of_any_type_are_scrubbed(
    json_log: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = json_log
    fields = {
        "error": RuntimeError(f"upstream refused Bearer {SECRETS['gateway key'][0]}"),
        "errors": [ValueError(SECRETS["url password"][0])],
        "password": "hunter2-plain",
        "api_key": 123456789,
        "client": {"x-api-key": "plainkey42", "name": "acme"},
        "credentials": Credentials("bob", "repr-hidden-pw"),
        "model": "llama-3.1-8b-instruct",
        "prompt_tokens": 512,
        "stream": True,
        "reason": None,
    }
    logger.warning("call failed", extra={"fields": fields})
    text = stream.getvalue()
    (line,) = lines(stream)
    for secret in ("sk-acme", "hunter2", "123456789", "plainkey42", "repr-hidden-pw"):
        assert secret not in text
    assert leftovers_in(text) == []
    assert line["error"] == "upstream refused Bearer [REDACTED]"
    assert line["password"] == "[REDACTED]" and line["api_key"] == "[REDACTED]"
    assert line["client"] == {"x-api-key": "[REDACTED]", "name": "acme"}
    assert line["model"] == "llama-3.1-8b-instruct" and line["prompt_tokens"] == 512
    assert line["stream"] is True and line["reason"] is None


def test_clean_fields_go_out_unchanged(json_log: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = json_log
    fields = {
        "request_id": "req_01J9ZK3QW8X4T2M6N7P5R",
        "tenant": "acme",
        "model": "deepseek-r1-distill-qwen-7b",
        "fallbacks": ["gpt-4o-mini"],
        "prompt_tokens": 512,
        "completion_tokens": 128,
        "duration_ms": 1234.56,
        "stream": False,
        "reason": None,
    }
    logger.info("request", extra={"fields": fields})
    (line,) = lines(stream)
    assert {key: line[key] for key in fields} == fields


def test_logger_exception_traceback_is_scrubbed(
    json_log: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = json_log
    try:
        try:
            raise ConnectionError(f"cannot reach {SECRETS['url password, empty user'][0]}")
        except ConnectionError as exc:
            raise RuntimeError(f"backend said: {ALL_SECRETS}") from exc
    except RuntimeError:
        logger.exception("calling %s failed", SECRETS["url password with / and @"][0])
    (line,) = lines(stream)
    assert "Traceback" in str(line["exception"]) and "ConnectionError" in str(line["exception"])
    assert leftovers_in(stream.getvalue()) == []


def test_plain_handlers_get_redacted_messages_too() -> None:
    entry = record("key %s", SECRETS["gateway key"][0])
    RedactingFilter().filter(entry)
    assert entry.getMessage() == "key [REDACTED]"


def test_keys_are_redacted_from_log_lines() -> None:
    assert redact("Authorization: Bearer abc.def") == "Authorization: Bearer [REDACTED]"
    assert redact("key sk-acme-demo leaked") == "key [REDACTED] leaked"
    record = logging.LogRecord("x", logging.INFO, "f", 1, "got %s", ("sk-secret-123",), None)
    RedactingFilter().filter(record)
    assert record.getMessage() == "got [REDACTED]"


class CountingStream(io.StringIO):
    """A stream that counts its writes: each is a system call on a real pipe."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


def batching_log() -> tuple[logging.Logger, CountingStream]:
    stream = CountingStream()
    handler = BatchingStreamHandler()
    handler.setStream(stream)  # type: ignore[arg-type]
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("gateway.test.batching")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger, stream


def test_the_lines_of_one_turn_of_the_loop_are_written_at_once_and_in_order() -> None:
    logger, stream = batching_log()

    async def requests_ending() -> None:
        for index in range(50):
            logger.info("request %d", index, extra={SCRUBBED: True})
        assert stream.writes == 0  # not yet: at the end of this turn of the loop
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        logger.info("next turn", extra={SCRUBBED: True})
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    asyncio.run(requests_ending())
    messages = [line["message"] for line in lines(stream)]
    assert messages == [f"request {index}" for index in range(50)] + ["next turn"]
    assert stream.writes == 2


def test_other_lines_are_written_at_once_after_the_access_lines_waiting() -> None:
    logger, stream = batching_log()

    async def shutting_down() -> None:
        logger.info("request 1", extra={SCRUBBED: True})
        logger.info("Application shutdown complete.")  # the process may die right after
        assert [line["message"] for line in lines(stream)] == [
            "request 1",
            "Application shutdown complete.",
        ]

    asyncio.run(shutting_down())


def test_a_line_made_outside_the_loop_is_written_at_once_after_those_waiting() -> None:
    logger, stream = batching_log()
    logger.info("before the server starts")
    assert [line["message"] for line in lines(stream)] == ["before the server starts"]
    loop = asyncio.new_event_loop()

    async def last_words() -> None:
        # Its write is due on a loop that stops.
        logger.info("said as the loop stops", extra={SCRUBBED: True})
        loop.stop()

    loop.run_until_complete(last_words())
    loop.close()
    assert stream.writes == 1  # its write never ran: the next loop's takes it along

    async def next_server() -> None:
        logger.info("on the next loop", extra={SCRUBBED: True})
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    asyncio.run(next_server())
    messages = [line["message"] for line in lines(stream)]
    assert messages == ["before the server starts", "said as the loop stops", "on the next loop"]
