"""Anthropic's Message Batches: `/v1/messages/batches` create, retrieve, list, cancel,
delete, and the results (`results_url`, JSON lines).

A batch is its requests in the create's body (`{"requests": [{"custom_id", "params"}]}`,
at most 100,000 and `batches.max_message_batch_bytes`, 32 MB (Anthropic's: 256 MB);
`custom_id`s unique, `^[a-zA-Z0-9_-]{1,64}$`); each runs as
a Messages request of the key that made the batch. `request_counts` change as requests
finish (Anthropic's change only at the end: exact counts break no client). Errors are
Anthropic's shape; the key is `x-api-key` or `Authorization: Bearer`.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import tempfile
import time
from datetime import UTC, datetime
from typing import IO, Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse

from gateway.api.anthropic.anthropic_answers import credentials, error_response
from gateway.api.batch_apis.batch_service import MESSAGES_ENDPOINT, service_of
from gateway.api.batch_apis.files_api import int_param, json_response
from gateway.api.body import decode_json
from gateway.api.counted import CountRequest, serve_counted
from gateway.api.errors import APIError, bad_request, body_too_large
from gateway.batches.batch_input import BatchLine, LineError, request_line
from gateway.batches.batch_records import BatchApi, BatchRecord, BatchStatus
from gateway.batches.batch_store import NotCancellable, NotDeletable
from gateway.observability.access import RequestRecord
from gateway.serving.auth import Identity
from gateway.transport.streaming import ClientGone

MAX_REQUESTS = 100_000
CUSTOM_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")


async def create(request: Request) -> Response:
    """`POST /v1/messages/batches`."""
    return await _served(request, "message_batches_create", _create)


async def retrieve(request: Request) -> Response:
    """`GET /v1/messages/batches/{batch_id}`."""
    return await _served(request, "message_batches_retrieve", _retrieve)


async def list_batches(request: Request) -> Response:
    """`GET /v1/messages/batches`."""
    return await _served(request, "message_batches_list", _list)


async def cancel(request: Request) -> Response:
    """`POST /v1/messages/batches/{batch_id}/cancel`."""
    return await _served(request, "message_batches_cancel", _cancel)


async def delete(request: Request) -> Response:
    """`DELETE /v1/messages/batches/{batch_id}`."""
    return await _served(request, "message_batches_delete", _delete)


async def results(request: Request) -> Response:
    """`GET /v1/messages/batches/{batch_id}/results`."""
    return await _served(request, "message_batches_results", _results)


async def _served(request: Request, endpoint: str, handle: Any) -> Response:
    return await serve_counted(
        request, endpoint, handle, credentials=credentials, render_error=error_response
    )


def _time(value: float | None) -> str | None:
    if value is None:
        return None
    return datetime.fromtimestamp(value, UTC).isoformat().replace("+00:00", "Z")


def _processing_status(batch: BatchRecord) -> str:
    if batch.status.ended:
        return "ended"
    cancelling = batch.status is BatchStatus.CANCELLING or (
        batch.status is BatchStatus.FINALIZING and batch.final_status is BatchStatus.CANCELLED
    )
    return "canceling" if cancelling else "in_progress"


def message_batch(batch: BatchRecord, base_url: str) -> dict[str, object]:
    """A batch as Anthropic's `MessageBatch`; its `results_url` under `base_url` (""
    for a path alone)."""
    counts = batch.counts
    ended_at = batch.completed_at or batch.cancelled_at or batch.expired_at
    ended = batch.status.ended
    return {
        "id": batch.id,
        "type": "message_batch",
        "processing_status": _processing_status(batch),
        "request_counts": {
            "processing": counts.total - counts.finished,
            "succeeded": counts.done,
            "errored": counts.failed,
            "canceled": counts.cancelled,
            "expired": counts.expired,
        },
        "ended_at": _time(ended_at),
        "created_at": _time(batch.created_at),
        "expires_at": _time(batch.expires_at),
        "archived_at": None,
        "cancel_initiated_at": _time(batch.cancelling_at),
        "results_url": f"{base_url}/v1/messages/batches/{batch.id}/results" if ended else None,
    }


def _base(request: Request) -> str:
    """Where `results_url` points: `batches.public_url`, else nowhere but a path."""
    return (service_of(request).config.public_url or "").rstrip("/")


def _not_found(batch_id: str) -> APIError:
    return APIError(
        404,
        f"Message batch {batch_id[:128]} not found.",
        type="not_found_error",
        code="batch_not_found",
    )


async def _create(
    request: Request, identity: Identity, record: RequestRecord, count: CountRequest
) -> Response:
    limits = await count("")
    service = service_of(request)
    await service.refuse_past_open_limit(identity)
    # The body goes to a file first, outside the lock: a client that sends it slowly
    # holds up nobody else's create, and waiting bodies do not sit in memory.
    with tempfile.TemporaryFile() as spooled:
        await _spool(request, spooled, service.config.max_message_batch_bytes)
        async with service.making:
            # Parsed and checked off the event loop: 100,000 requests take a while.
            lines, models = await asyncio.to_thread(
                lambda: service.lines_of(identity, _requests(_load(spooled)))
            )
            batch = await service.make(
                identity, BatchApi.ANTHROPIC, MESSAGES_ENDPOINT, "", lines, models, None
            )
    return json_response(message_batch(batch, _base(request)), limits)


async def _spool(request: Request, into: IO[bytes], limit: int) -> None:
    """The request's body written to `into`; past `limit` bytes, a 413."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdecimal() and int(declared) > limit:
        raise body_too_large(limit)
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise body_too_large(limit)
            await asyncio.to_thread(into.write, chunk)
    except ClientDisconnect:
        raise ClientGone from None


def _load(spooled: IO[bytes]) -> Any:
    spooled.seek(0)
    return decode_json(spooled.read())


def _requests(data: Any) -> list[BatchLine | LineError]:
    """The create's requests, checked as a whole; each `params` kept as JSON text."""
    requests = data.get("requests") if isinstance(data, dict) else None
    if not isinstance(requests, list) or not requests:
        raise bad_request("`requests` must be a list of at least one request.", "requests")
    if len(requests) > MAX_REQUESTS:
        raise bad_request(
            f"A batch may hold at most {MAX_REQUESTS:,} requests, not {len(requests):,}.",
            "requests",
        )
    seen: dict[str, int] = {}
    out: list[BatchLine | LineError] = []
    for index, item in enumerate(requests):
        where = f"requests.{index}"
        if not isinstance(item, dict):
            raise bad_request(f"`{where}` must be an object.", where)
        custom_id, params = item.get("custom_id"), item.get("params")
        if not isinstance(custom_id, str) or not CUSTOM_ID.fullmatch(custom_id):
            raise bad_request(
                f"`{where}.custom_id` must match ^[a-zA-Z0-9_-]{{1,64}}$.", f"{where}.custom_id"
            )
        if custom_id in seen:
            raise bad_request(
                f"`custom_id` {custom_id} is used by requests {seen[custom_id]} and {index}: "
                "each must be unique.",
                f"{where}.custom_id",
            )
        seen[custom_id] = index
        if not isinstance(params, dict):
            raise bad_request(f"`{where}.params` must be an object.", f"{where}.params")
        out.append(request_line(index + 1, custom_id, params))
    return out


async def _retrieve(
    request: Request, identity: Identity, record: RequestRecord, count: CountRequest
) -> Response:
    limits = await count("")
    batch = await _batch(request, identity)
    return json_response(message_batch(batch, _base(request)), limits)


async def _batch(request: Request, identity: Identity) -> BatchRecord:
    batch_id = request.path_params["batch_id"]
    batch = await service_of(request).store.batch(identity.name, batch_id, BatchApi.ANTHROPIC)
    if batch is None:
        raise _not_found(batch_id)
    return batch


async def _list(
    request: Request, identity: Identity, record: RequestRecord, count: CountRequest
) -> Response:
    limits = await count("")
    params = request.query_params
    limit = int_param(params.get("limit"), 20, 1, 1000, "limit")
    after, before = params.get("after_id"), params.get("before_id")
    if after is not None and before is not None:
        raise bad_request("Give `after_id` or `before_id`, not both.", "before_id")
    batches, more = await service_of(request).store.batches(
        identity.name, BatchApi.ANTHROPIC, after=after, before=before, limit=limit
    )
    base = _base(request)
    data = [message_batch(b, base) for b in batches]
    page = {
        "data": data,
        "has_more": more,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
    }
    return json_response(page, limits)


async def _cancel(
    request: Request, identity: Identity, record: RequestRecord, count: CountRequest
) -> Response:
    limits = await count("")
    batch = await _batch(request, identity)
    service = service_of(request)
    with contextlib.suppress(NotCancellable):  # ended: the batch as it is, as Anthropic's
        await service.cancel(batch)
    batch = await _batch(request, identity)
    return json_response(message_batch(batch, _base(request)), limits)


async def _delete(
    request: Request, identity: Identity, record: RequestRecord, count: CountRequest
) -> Response:
    limits = await count("")
    batch = await _batch(request, identity)
    service = service_of(request)
    try:
        await service.store.delete_batch(identity.name, batch.id, BatchApi.ANTHROPIC, time.time())
    except NotDeletable:
        raise APIError(
            409,
            "A batch can be deleted once it has ended; cancel it first.",
            code="batch_not_ended",
            headers={"x-should-retry": "false"},
        ) from None
    if batch.output_file_id is not None:
        results_file = await service.store.delete_file(
            identity.name, batch.output_file_id, time.time()
        )
        if results_file is not None:
            await service.objects.delete(results_file.object_key)
    return json_response({"id": batch.id, "type": "message_batch_deleted"}, limits)


async def _results(
    request: Request, identity: Identity, record: RequestRecord, count: CountRequest
) -> Response:
    limits = await count("")
    batch = await _batch(request, identity)
    service = service_of(request)
    file = None
    if batch.output_file_id is not None:
        file = await service.store.file(identity.name, batch.output_file_id)
    if not batch.status.ended or file is None:
        raise APIError(
            404,
            f"Message batch {batch.id} has no results yet: they are ready once it has ended.",
            type="not_found_error",
            code="results_not_ready",
        )
    return StreamingResponse(
        service.objects.get(file.object_key), headers=limits, media_type="application/binary"
    )
