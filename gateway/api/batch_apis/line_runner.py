"""One line of a batch run as one request of the key that made the batch.

The line goes through the conductor as a client's request does (`Incoming`, with its
`batch_id`): the wire's parse, the tenant's and the key's rate limits and budgets, the
admission queue (in the `batch-api` class, below every online one), the fallback chain,
the usage ledger (priced with the batch discount). What it answers becomes the line's
outcome for the worker:

- an answer, or an error the request itself earned (a bad body, a model refused, an
  upstream failure after its retries): recorded, in the output or the error file;
- a wait (a rate limit, a full queue, a deadline passed while it queued behind online
  traffic, a model scaling up): the line goes back, to run after the wait;
- the key's budget spent, or the key revoked: the batch stops, every line not yet run
  failed with that error (none runs free).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import orjson

from gateway.admission import DeadlineExceeded, Overloaded, Shed
from gateway.api import errors
from gateway.api.body import decode_json, requested_model
from gateway.api.errors import APIError
from gateway.api.exchange import parsed, refusal_of, rendered
from gateway.api.wire import Wire
from gateway.batches.batch_records import BatchRecord, ClaimedLine, LineUsage
from gateway.batches.batch_worker import LineOutcome, Outcome
from gateway.inference.ids import random_id
from gateway.inference.types import InferenceRequest
from gateway.observability.access import RequestRecord
from gateway.ratelimit.errors import LimiterUnavailable
from gateway.serving.auth import Identity, InvalidApiKey
from gateway.serving.conductor import Answer, Conductor
from gateway.serving.dispatch import DeadlineMissed
from gateway.serving.errors import NotServed, RateLimited
from gateway.serving.idempotency import Reply
from gateway.serving.runtime import Runtime
from gateway.upstream.route import ModelRoute

log = logging.getLogger("gateway.batches")

# What says "not now" rather than "no": the line runs again after the wait.
_WAITS = (Shed, Overloaded, DeadlineExceeded, DeadlineMissed, LimiterUnavailable)
# A wait no refusal named: a second.
_DEFAULT_WAIT_S = 1.0
# The share of a tenant's request and token buckets its batches leave to its online
# requests; below it, its lines wait this long (the buckets refill meanwhile).
HEADROOM = 0.25
_HEADROOM_WAIT_S = 1.0


class LineRunner:
    """`batch_worker.LineRunner` for this gateway: lines of each API through its wire."""

    def __init__(self, runtime: Runtime, conductor: Conductor, wires: Mapping[str, Wire]) -> None:
        self._runtime = runtime
        self._conductor = conductor
        # By the batch's endpoint (`/v1/chat/completions`, ..., `/v1/messages`).
        self._wires = wires

    async def __call__(self, batch: BatchRecord, line: ClaimedLine) -> LineOutcome:
        wire = self._wires[batch.endpoint]
        runtime = self._runtime
        record = RequestRecord(
            wire.id_prefix + random_id(), endpoint=wire.name, sink=runtime.record_sink
        )
        record.tenant, record.key_id = batch.tenant, batch.key_id
        try:
            identity = runtime.auth.identity_of(batch.tenant, batch.key_id)
            reply = await self._conductor.conduct(
                _LineIncoming(runtime, wire, record, line, batch.id), identity
            )
        except Exception as exc:
            outcome = _refused(wire, record, exc)
            if outcome.outcome is Outcome.RETRY:
                # The worker's own wait, not a request the batch made: in the metrics
                # and the log, not the usage ledger.
                record.sink = None
            record.finish(outcome.status_code, None)
            return outcome
        assert isinstance(reply, Reply)  # a line never streams (refused when made)
        record.finish(reply.status)
        usage = LineUsage(record.prompt_tokens, record.cached_tokens, record.completion_tokens)
        return LineOutcome(
            Outcome.ANSWERED, reply.status, record.request_id, reply.body.decode(), usage,
            pause_s=_headroom_pause(reply.headers),
        )  # fmt: skip


def _headroom_pause(headers: Mapping[str, str]) -> float:
    """How long the tenant's lines wait (0: not at all) after an answer whose rate-limit
    headers say its buckets are nearly spent: a batch takes its tenant's request and
    token buckets down to `HEADROOM` of their size, no further, so that the tenant's
    own online requests always find some left."""
    for kind in ("requests", "tokens"):
        limit = headers.get(f"x-ratelimit-limit-{kind}", "")
        remaining = headers.get(f"x-ratelimit-remaining-{kind}", "")
        known = limit.isdecimal() and remaining.isdecimal()
        if known and int(remaining) < HEADROOM * int(limit):
            return _HEADROOM_WAIT_S
    return 0.0


def _refused(wire: Wire, record: RequestRecord, exc: Exception) -> LineOutcome:
    """What a refusal means for the line: wait, stop the batch, or an error to record."""
    cause = exc.__cause__ if isinstance(exc, APIError) and exc.__cause__ is not None else exc
    if isinstance(cause, NotServed):
        cause = cause.cause
    if isinstance(cause, InvalidApiKey):
        revoked = APIError(
            401,
            "The API key that created this batch was revoked or has expired: this request "
            "and the rest of the batch were not run.",
            type="authentication_error",
            code="batch_key_revoked",
        )
        return _stop(wire, record, revoked, "key_revoked")
    if isinstance(cause, RateLimited):
        decision = cause.decision
        if decision.refused_by == "spend":
            return _stop(wire, record, errors.client_error(cause), "budget")
        if not decision.never_fits:
            return LineOutcome(Outcome.RETRY, 429, retry_after_s=_wait(decision.retry_after_s))
    if isinstance(cause, _WAITS):
        return LineOutcome(
            Outcome.RETRY, 503, retry_after_s=_wait(getattr(cause, "retry_after_s", None))
        )
    if isinstance(exc, errors.CLIENT_ERRORS):
        error = errors.client_error(exc)
    else:
        log.error("batch line %s: %r", record.request_id, exc, exc_info=exc)
        error = APIError(500, "The gateway failed to handle the request.", type="server_error")
    return LineOutcome(Outcome.ANSWERED, error.status, record.request_id, _error_body(wire, error))


def _stop(wire: Wire, record: RequestRecord, error: APIError, reason: str) -> LineOutcome:
    return LineOutcome(
        Outcome.STOP, error.status, record.request_id, _error_body(wire, error), reason=reason
    )


def _wait(seconds: float | None) -> float:
    return _DEFAULT_WAIT_S if seconds is None or seconds <= 0 else min(seconds, 60.0)


def _error_body(wire: Wire, error: APIError) -> str:
    """The error's JSON body as the line's API writes it."""
    if wire.render_error is not None:
        return bytes(wire.render_error(error).body).decode()
    return orjson.dumps(error.body()).decode()


class _NoClient:
    """A line's client: nobody waits on a connection that could close."""

    gone = False

    def cancel_when_gone(self) -> None:
        return None

    def stop(self) -> None:
        return None


class _LineIncoming:
    """A batch line as the conductor sees it (`serving.conductor.Incoming`)."""

    credentials = None
    priority = None
    timeout = None
    idempotency_key = None

    def __init__(
        self, runtime: Runtime, wire: Wire, record: RequestRecord, line: ClaimedLine, batch: str
    ) -> None:
        self.runtime, self.wire, self.record, self.line = runtime, wire, record, line
        self.batch_id = batch

    async def read(self, limit: int) -> tuple[Mapping[str, Any], int]:
        body = self.line.body.encode()
        if len(body) > limit:
            raise errors.body_too_large(limit)
        return decode_json(body), len(body)

    def requested_model(self, data: Mapping[str, Any]) -> str:
        return requested_model(data)

    async def parse(
        self, identity: Identity, route: ModelRoute, data: Mapping[str, Any], size: int
    ) -> InferenceRequest:
        return await parsed(self.wire, self.runtime, identity, route, data, size, _NO_HEADERS)

    def fingerprint(self, data: Mapping[str, Any]) -> str:
        return ""  # a line has no Idempotency-Key: its lease makes its answer once

    def client(self) -> _NoClient:
        return _NoClient()

    async def render(self, answer: Answer, identity: Identity) -> Reply:
        return await rendered(self.wire, self.runtime, self.record, answer, identity)

    def refusal(self, exc: Exception) -> APIError:
        return refusal_of(exc, self.record, f"batch {self.batch_id} line {self.line.line_no}")


_NO_HEADERS: Mapping[str, str] = {}
