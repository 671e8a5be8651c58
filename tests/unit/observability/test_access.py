"""The request record: counted and logged once, with bounded labels, whatever ended it."""

from __future__ import annotations

import logging
import time

import pytest

from gateway.observability import metrics
from gateway.observability.access import UNKNOWN, RequestRecord


def sample(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


def access_fields(caplog: pytest.LogCaptureFixture) -> list[dict[str, object]]:
    return [r.fields for r in caplog.records if r.name == "gateway.access"]  # type: ignore[attr-defined]


def test_a_request_refused_before_anything_is_known_counts_under_dashes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    labels = {
        "tenant": UNKNOWN,
        "model": UNKNOWN,
        "served_model": "-",
        "status": "401",
        "endpoint": "chat",
    }
    before = sample("gateway_requests_total", **labels)
    caplog.set_level(logging.INFO, "gateway.access")
    record = RequestRecord("chatcmpl-unit-1")
    record.finish(401)
    record.finish(500)  # a second end is ignored
    assert sample("gateway_requests_total", **labels) == before + 1
    [fields] = access_fields(caplog)
    assert fields["request_id"] == "chatcmpl-unit-1"
    assert (fields["tenant"], fields["model"], fields["status"]) == ("-", "-", 401)
    assert fields["queue_wait_ms"] is None


def test_the_wait_of_a_request_refused_after_queueing_is_observed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    waits = {"model": "unit-small", "priority": "batch"}
    count = sample("gateway_queue_wait_seconds_count", **waits)
    total = sample("gateway_queue_wait_seconds_sum", **waits)
    refusals = {"tenant": "unit", "model": "unit-large", "reason": "shed"}
    refused = sample("gateway_refusals_total", **refusals)
    caplog.set_level(logging.INFO, "gateway.access")
    # Asked for unit-large, shed from the queue of its fallback unit-small.
    record = RequestRecord("chatcmpl-unit-2", "unit", "unit-large", priority="batch")
    record.queue_wait_s, record.queue_model = 1.5, "unit-small"
    record.finish(503, "shed")
    assert sample("gateway_queue_wait_seconds_count", **waits) == count + 1
    assert sample("gateway_queue_wait_seconds_sum", **waits) == pytest.approx(total + 1.5)
    assert sample("gateway_refusals_total", **refusals) == refused + 1
    [fields] = access_fields(caplog)
    assert (fields["status"], fields["reason"], fields["queue_wait_ms"]) == (503, "shed", 1500.0)
    assert fields["served_model"] is None


def test_a_request_that_never_queued_observes_no_wait() -> None:
    waits = {"model": "unit-none", "priority": "online"}
    count = sample("gateway_queue_wait_seconds_count", **waits)
    RequestRecord("chatcmpl-unit-3", "unit", "unit-none", priority="online").finish(499)
    assert sample("gateway_queue_wait_seconds_count", **waits) == count


def test_a_served_request_observes_its_wait_under_the_serving_model() -> None:
    waits = {"model": "unit-served", "priority": "online"}
    count = sample("gateway_queue_wait_seconds_count", **waits)
    record = RequestRecord("chatcmpl-unit-4", "unit", "unit-asked", priority="online")
    record.served_model, record.queue_wait_s = "unit-served", 0.0
    record.finish(200)
    assert sample("gateway_queue_wait_seconds_count", **waits) == count + 1


def test_the_values_a_client_chose_are_redacted_in_the_access_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The line's other values are the gateway's own and are not scanned again; a model
    # name (an alias's) and a logged prompt are the client's, and may hold a key.
    caplog.set_level(logging.INFO, "gateway.access")
    record = RequestRecord("chatcmpl-unit-redact", tenant="acme", model="llm-small")
    record.alias = "sk-acme-leaked-0123456789abcdef"
    record.prompt = "my key is sk-acme-leaked-0123456789abcdef, keep it"
    record.finish(200)
    [fields] = access_fields(caplog)
    assert fields["requested_model"] == "[REDACTED]"
    assert fields["prompt"] == "my key is [REDACTED], keep it"
    assert "sk-acme" not in caplog.text


def test_the_access_line_is_a_whole_record_for_any_formatter(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The record is made without `log.info` (for speed): a handler an operator adds with
    # its own format must still find every attribute, and the line's own time.
    caplog.set_level(logging.INFO, "gateway.access")
    before = time.time()
    RequestRecord("chatcmpl-unit-whole", tenant="acme", model="llm-small").finish(200)
    [record] = [r for r in caplog.records if r.name == "gateway.access"]
    formatter = logging.Formatter(
        "%(asctime)s %(name)s %(levelname)s %(module)s %(funcName)s %(process)s %(message)s"
    )
    assert formatter.format(record).endswith("request")
    assert record.levelno == logging.INFO and record.getMessage() == "request"
    assert before <= record.created <= time.time()
    assert record.relativeCreated > 0
