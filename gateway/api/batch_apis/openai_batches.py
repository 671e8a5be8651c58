"""OpenAI's Batch API: `/v1/batches` create, retrieve, list (newest first), cancel.

A batch is made from an uploaded file of its tenant (purpose `batch`): the file is read
and checked whole (`gateway.batches.batch_input`: past 200 MB or 50,000 lines, with no
request, or with a `custom_id` twice, it is refused with what refused it), each line's
model checked against the caller's (a line it may not use goes to the error file), and
the batch recorded in progress. Its lines then run on idle capacity (`batch_worker`).
`request_counts` and `usage` change as lines finish.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from gateway.api.batch_apis.batch_service import OPENAI_ENDPOINTS, BatchService, service_of
from gateway.api.batch_apis.files_api import (
    MAX_TTL_S,
    MIN_TTL_S,
    file_not_found,
    int_param,
    json_response,
    page,
)
from gateway.api.body import decode_json
from gateway.api.counted import CountRequest, serve_counted
from gateway.api.errors import APIError, bad_request
from gateway.api.exchange import read_body
from gateway.batches.batch_input import BatchInputRefused, read_batch_input
from gateway.batches.batch_records import OUTPUT_TTL_S, BatchApi, BatchRecord, NewLine
from gateway.batches.batch_store import NotCancellable
from gateway.batches.batch_worker import ANTHROPIC_RESULTS_PURPOSE
from gateway.batches.object_store import read_all
from gateway.observability.access import RequestRecord
from gateway.serving.auth import Identity

# OpenAI's caps on `metadata`.
MAX_METADATA_KEYS, MAX_METADATA_KEY_CHARS, MAX_METADATA_VALUE_CHARS = 16, 64, 512
_CREATE_BODY_BYTES = 64 * 1024


async def create(request: Request) -> Response:
    """`POST /v1/batches`."""
    return await serve_counted(request, "batches_create", _create)


async def retrieve(request: Request) -> Response:
    """`GET /v1/batches/{batch_id}`."""
    return await serve_counted(request, "batches_retrieve", _retrieve)


async def list_batches(request: Request) -> Response:
    """`GET /v1/batches`."""
    return await serve_counted(request, "batches_list", _list)


async def cancel(request: Request) -> Response:
    """`POST /v1/batches/{batch_id}/cancel`."""
    return await serve_counted(request, "batches_cancel", _cancel)


def batch_object(batch: BatchRecord) -> dict[str, object]:
    """A batch as OpenAI's `Batch`."""
    counts, tokens = batch.counts, batch.tokens

    def at(value: float | None) -> int | None:
        return None if value is None else int(value)

    return {
        "id": batch.id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "errors": None if batch.errors is None else {"object": "list", "data": batch.errors},
        "input_file_id": batch.input_file_id,
        "completion_window": batch.completion_window,
        "status": batch.status.value,
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "created_at": int(batch.created_at),
        "in_progress_at": at(batch.in_progress_at),
        "expires_at": int(batch.expires_at),
        "finalizing_at": at(batch.finalizing_at),
        "completed_at": at(batch.completed_at),
        "failed_at": at(batch.failed_at),
        "expired_at": at(batch.expired_at),
        "cancelling_at": at(batch.cancelling_at),
        "cancelled_at": at(batch.cancelled_at),
        "request_counts": {
            "total": counts.total,
            "completed": counts.done,
            "failed": counts.failed + counts.cancelled + counts.expired,
        },
        "metadata": batch.metadata,
        "model": batch.models[0] if len(batch.models) == 1 else None,
        "usage": {
            "input_tokens": tokens.input_tokens,
            "input_tokens_details": {"cached_tokens": tokens.cached_tokens},
            "output_tokens": tokens.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": tokens.input_tokens + tokens.output_tokens,
        },
    }


def batch_not_found(batch_id: str) -> APIError:
    return APIError(404, f"No batch found with id '{batch_id[:128]}'.", code="batch_not_found")


async def _create(
    request: Request, identity: Identity, record: RequestRecord, count: CountRequest
) -> Response:
    limits = await count("")
    service = service_of(request)
    data = decode_json(await read_body(request, _CREATE_BODY_BYTES))
    if not isinstance(data, dict):
        raise bad_request("The body must be a JSON object.")
    endpoint = data.get("endpoint")
    if not isinstance(endpoint, str) or endpoint not in OPENAI_ENDPOINTS:
        raise bad_request(f"`endpoint` must be one of {', '.join(OPENAI_ENDPOINTS)}.", "endpoint")
    if data.get("completion_window") != "24h":
        raise bad_request("`completion_window` must be `24h`.", "completion_window")
    metadata = _metadata(data.get("metadata"))
    output_ttl_s = _output_ttl(data.get("output_expires_after"))
    file_id = data.get("input_file_id")
    if not isinstance(file_id, str) or not file_id:
        raise bad_request("`input_file_id` must be a file id.", "input_file_id")
    file = await service.store.file(identity.name, file_id)
    if file is None or file.purpose == ANTHROPIC_RESULTS_PURPOSE:
        raise file_not_found(file_id, "input_file_id")
    if file.purpose != "batch":
        raise bad_request(
            f"The file {file_id} has purpose `{file.purpose}`: a batch's input file is one "
            "uploaded with purpose `batch`.",
            "input_file_id",
        )
    await service.refuse_past_open_limit(identity)
    async with service.making:
        raw = await read_all(service.objects, file.object_key)
        try:
            # Read and checked off the event loop: 50,000 lines take a while.
            lines, models = await asyncio.to_thread(_lines, service, identity, raw, endpoint)
        except BatchInputRefused as refused:
            raise bad_request(str(refused), "input_file_id") from None
        del raw
        batch = await service.make(
            identity, BatchApi.OPENAI, endpoint, file_id, lines, models, metadata, output_ttl_s
        )
    return json_response(batch_object(batch), limits)


def _lines(
    service: BatchService, identity: Identity, raw: bytes, endpoint: str
) -> tuple[list[NewLine], tuple[str, ...]]:
    """The file's lines for the store, in input order, and the models they run on."""
    read = read_batch_input(raw, endpoint)
    return service.lines_of(identity, [*read.lines, *read.errors])


def _output_ttl(value: Any) -> float:
    """`output_expires_after`: how long the output files are kept (default 30 days)."""
    if value is None:
        return OUTPUT_TTL_S
    seconds = value.get("seconds") if isinstance(value, dict) else None
    if (
        not isinstance(value, dict)
        or value.get("anchor") != "created_at"
        or not isinstance(seconds, int)
        or isinstance(seconds, bool)
        or not MIN_TTL_S <= seconds <= MAX_TTL_S
    ):
        raise bad_request(
            f"`output_expires_after` is `anchor: created_at` and `seconds` from {MIN_TTL_S} "
            f"to {MAX_TTL_S}.",
            "output_expires_after",
        )
    return float(seconds)


def _metadata(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > MAX_METADATA_KEYS:
        raise bad_request(
            f"`metadata` is an object of at most {MAX_METADATA_KEYS} string pairs.", "metadata"
        )
    for key, item in value.items():
        if len(key) > MAX_METADATA_KEY_CHARS or not isinstance(item, str):
            raise bad_request(
                f"`metadata` keys are at most {MAX_METADATA_KEY_CHARS} characters and its "
                "values strings.",
                "metadata",
            )
        if len(item) > MAX_METADATA_VALUE_CHARS:
            raise bad_request(
                f"`metadata` values are at most {MAX_METADATA_VALUE_CHARS} characters.",
                "metadata",
            )
    return dict(value)


async def _retrieve(
    request: Request, identity: Identity, record: RequestRecord, count: CountRequest
) -> Response:
    limits = await count("")
    batch_id = request.path_params["batch_id"]
    batch = await service_of(request).store.batch(identity.name, batch_id, BatchApi.OPENAI)
    if batch is None:
        raise batch_not_found(batch_id)
    return json_response(batch_object(batch), limits)


async def _list(
    request: Request, identity: Identity, record: RequestRecord, count: CountRequest
) -> Response:
    limits = await count("")
    params = request.query_params
    limit = int_param(params.get("limit"), 20, 1, 100, "limit")
    batches, more = await service_of(request).store.batches(
        identity.name, BatchApi.OPENAI, after=params.get("after"), limit=limit
    )
    return json_response(page([batch_object(b) for b in batches], more), limits)


async def _cancel(
    request: Request, identity: Identity, record: RequestRecord, count: CountRequest
) -> Response:
    limits = await count("")
    batch_id = request.path_params["batch_id"]
    service = service_of(request)
    batch = await service.store.batch(identity.name, batch_id, BatchApi.OPENAI)
    if batch is None:
        raise batch_not_found(batch_id)
    try:
        await service.cancel(batch)
    except NotCancellable as ended:
        raise not_cancellable(ended) from None
    batch = await service.store.batch(identity.name, batch_id, BatchApi.OPENAI)
    assert batch is not None
    return json_response(batch_object(batch), limits)


def not_cancellable(ended: NotCancellable) -> APIError:
    """The 409 of a cancel that comes after the batch's end (never worth retrying)."""
    return APIError(
        409,
        f"Cannot cancel a batch with status `{ended.status.value}`.",
        code="batch_not_cancellable",
        headers={"x-should-retry": "false"},
    )
