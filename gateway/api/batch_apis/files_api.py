"""OpenAI's Files API for batches: `/v1/files` upload (multipart, purpose `batch`), list,
retrieve, content, delete. Files are their tenant's: another tenant's id is a 404 that
does not say whether it exists.

An upload is parsed as it arrives (python-multipart's streaming parser) and its file
part goes to the object store chunk by chunk, counted: past 200 MB it is refused with
the limit named, whatever `Content-Length` said, and nothing of it is kept. Starlette's
own form parser would spool the whole part first, with no cap.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import orjson
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse

from gateway.api.batch_apis.batch_service import service_of
from gateway.api.counted import CountRequest, serve_counted
from gateway.api.errors import APIError, bad_request
from gateway.batches.batch_input import MAX_FILE_BYTES
from gateway.batches.batch_records import FileRecord
from gateway.batches.batch_worker import ANTHROPIC_RESULTS_PURPOSE
from gateway.inference.ids import random_id
from gateway.observability.access import RequestRecord
from gateway.serving.auth import Identity
from gateway.transport.streaming import ClientGone

# Only batch input files are uploaded here (the gateway serves no other use of files).
UPLOAD_PURPOSES = ("batch",)
# How long an uploaded batch file is kept unless the upload asks otherwise: 30 days.
DEFAULT_FILE_TTL_S = 30 * 86400
# What `expires_after` (an upload's, a batch's output's) may ask for: 1 hour to 30 days.
MIN_TTL_S, MAX_TTL_S = 3600, 30 * 86400
# A form's fields other than the file are short: a purpose, an expiry.
_MAX_FIELD_BYTES = 1024
_MAX_FILENAME_CHARS = 255
# What a form may hold besides its file: part headers, boundaries, the purpose.
_FORM_OVERHEAD_BYTES = 64 * 1024


async def upload(request: Request) -> Response:
    """`POST /v1/files`."""
    return await serve_counted(request, "files_create", _upload)


async def list_files(request: Request) -> Response:
    """`GET /v1/files`."""
    return await serve_counted(request, "files_list", _list)


async def retrieve(request: Request) -> Response:
    """`GET /v1/files/{file_id}`."""
    return await serve_counted(request, "files_retrieve", _retrieve)


async def content(request: Request) -> Response:
    """`GET /v1/files/{file_id}/content`."""
    return await serve_counted(request, "files_content", _content)


async def delete(request: Request) -> Response:
    """`DELETE /v1/files/{file_id}`."""
    return await serve_counted(request, "files_delete", _delete)


def file_object(file: FileRecord) -> dict[str, object]:
    """A file as OpenAI's `FileObject`."""
    return {
        "id": file.id,
        "object": "file",
        "bytes": file.bytes,
        "created_at": int(file.created_at),
        "filename": file.filename,
        "purpose": file.purpose,
        "status": "processed",
        "expires_at": None if file.expires_at is None else int(file.expires_at),
        "status_details": None,
    }


def file_not_found(file_id: str, param: str | None = None) -> APIError:
    """The 404 of a file that is not the caller's (or not there at all: the same)."""
    return APIError(
        404, f"No such File object: {file_id[:128]}", param=param, code="file_not_found"
    )


async def visible_file(request: Request, identity: Identity, file_id: str) -> FileRecord:
    """The caller's tenant's file `file_id`, as the Files API shows files; else a 404."""
    file = await service_of(request).store.file(identity.name, file_id)
    if file is None or file.purpose == ANTHROPIC_RESULTS_PURPOSE:
        raise file_not_found(file_id)
    return file


def json_response(data: object, headers: dict[str, str], status: int = 200) -> Response:
    return Response(orjson.dumps(data), status, headers=headers, media_type="application/json")


@dataclass(slots=True)
class _Form:
    """What the streaming parser found: the fields, and the file part's name."""

    fields: dict[str, bytearray] = field(default_factory=dict)
    filename: str | None = None
    saw_file: bool = False
    # The closing boundary was read: the form is whole.
    ended: bool = False


@dataclass(slots=True)
class _Part:
    """The part being parsed: its name once its headers are read."""

    name: str | None = None
    header: bytes = b""
    headers: dict[bytes, bytes] = field(default_factory=dict)


async def _upload(
    request: Request, identity: Identity, record: RequestRecord, count: CountRequest
) -> Response:
    limits = await count("")
    service = service_of(request)
    declared = request.headers.get("content-length")
    if (
        declared is not None
        and declared.isdecimal()
        and int(declared) > MAX_FILE_BYTES + _FORM_OVERHEAD_BYTES
    ):
        raise _too_large()
    kind, options = parse_options_header(request.headers.get("content-type", ""))
    boundary = options.get(b"boundary")
    if kind != b"multipart/form-data" or not boundary:
        raise bad_request("Send the file as multipart/form-data.", "file")
    room = service.config.max_file_bytes_per_tenant - await service.store.file_bytes(identity.name)
    if room <= 0:
        raise _quota_full(service.config.max_file_bytes_per_tenant)
    file_id = f"file-{random_id()}"
    key = f"{identity.name}/{file_id}"
    form = _Form()
    try:
        size = await service.objects.put(key, _file_part(request, boundary, form, room))
    except ClientDisconnect:
        raise ClientGone from None
    if not form.saw_file:
        await service.objects.delete(key)
        raise bad_request("The form has no `file` part.", "file")
    try:
        purpose, expires_after = _fields(form)
    except APIError:
        await service.objects.delete(key)
        raise
    now = time.time()
    filename = (form.filename or "upload.jsonl")[:_MAX_FILENAME_CHARS]
    file = FileRecord(
        file_id, identity.name, identity.key_id, purpose, filename, size, now,
        now + expires_after, key,
    )  # fmt: skip
    await service.store.add_file(file)
    return json_response(file_object(file), limits)


async def _file_part(
    request: Request, boundary: bytes, form: _Form, room: int
) -> AsyncIterator[bytes]:
    """The file part's bytes as the request's arrive, the other fields kept in `form`;
    past `MAX_FILE_BYTES`, or past the `room` its tenant's quota leaves, refused."""
    pending: list[bytes] = []
    part = _Part()
    size = 0

    def on_header_field(data: bytes, start: int, end: int) -> None:
        part.header += data[start:end]

    def on_header_value(data: bytes, start: int, end: int) -> None:
        name = part.header.lower()
        part.headers[name] = part.headers.get(name, b"") + data[start:end]

    def on_header_end() -> None:
        part.header = b""

    def on_headers_finished() -> None:
        _, options = parse_options_header(part.headers.get(b"content-disposition", b""))
        name = options.get(b"name", b"").decode("utf-8", "replace")
        part.name = name
        if name == "file":
            if form.saw_file:
                raise bad_request("The form has two `file` parts: send one.", "file")
            form.saw_file = True
            filename = options.get(b"filename")
            form.filename = None if filename is None else filename.decode("utf-8", "replace")
        else:
            form.fields[name] = bytearray()

    def on_part_data(data: bytes, start: int, end: int) -> None:
        name = part.name
        if name == "file":
            pending.append(data[start:end])
        elif isinstance(name, str):
            value = form.fields[name]
            value += data[start:end]
            if len(value) > _MAX_FIELD_BYTES:
                raise bad_request(f"The form field `{name[:64]}` is too long.", name[:64])

    def on_part_end() -> None:
        part.name, part.header, part.headers = None, b"", {}

    def on_end() -> None:
        form.ended = True

    parser = MultipartParser(
        boundary,
        {
            "on_header_field": on_header_field,
            "on_header_value": on_header_value,
            "on_header_end": on_header_end,
            "on_headers_finished": on_headers_finished,
            "on_part_data": on_part_data,
            "on_part_end": on_part_end,
            "on_end": on_end,
        },
    )
    received = 0
    try:
        async for chunk in request.stream():
            # The whole body is counted too: what follows the form's end is not free.
            received += len(chunk)
            if received > MAX_FILE_BYTES + _FORM_OVERHEAD_BYTES:
                raise _too_large()
            parser.write(chunk)
            if len(form.fields) > 16:
                raise bad_request("The form has too many fields.")
            for data in pending:
                size += len(data)
                if size > MAX_FILE_BYTES:
                    raise _too_large()
                if size > room:
                    raise _quota_full(room)
                yield data
            pending.clear()
        parser.finalize()
    except MultipartParseError as broken:
        raise bad_request(f"The form is not well-formed multipart/form-data: {broken}.") from None
    if not form.ended:
        raise bad_request("The form ends before its closing boundary.")


def _fields(form: _Form) -> tuple[str, float]:
    """The upload's purpose and how long it is kept, from the form's fields."""
    purpose = bytes(form.fields.get("purpose", b"")).decode("utf-8", "replace")
    if purpose not in UPLOAD_PURPOSES:
        raise bad_request(
            f"`purpose` must be one of {', '.join(UPLOAD_PURPOSES)} (the gateway keeps "
            "files for the Batch API only).",
            "purpose",
        )
    seconds = form.fields.get("expires_after[seconds]")
    if seconds is None:
        return purpose, DEFAULT_FILE_TTL_S
    anchor = bytes(form.fields.get("expires_after[anchor]", b"created_at"))
    text = bytes(seconds).decode("ascii", "replace")
    if anchor != b"created_at" or not text.isdecimal() or not MIN_TTL_S <= int(text) <= MAX_TTL_S:
        raise bad_request(
            f"`expires_after` is `anchor: created_at` and `seconds` from {MIN_TTL_S} to "
            f"{MAX_TTL_S}.",
            "expires_after",
        )
    return purpose, float(text)


def _quota_full(room: int) -> APIError:
    return APIError(
        429,
        f"Your tenant's files may hold {room:,} more bytes at most (`batches."
        "max_file_bytes_per_tenant`): delete files, or wait for them to expire.",
        type="rate_limit_error",
        code="files_quota_exceeded",
        param="file",
        headers={"x-should-retry": "false"},
    )


def _too_large() -> APIError:
    return APIError(
        413,
        f"A batch file may be at most {MAX_FILE_BYTES:,} bytes (200 MB).",
        code="file_too_large",
        param="file",
    )


async def _list(
    request: Request, identity: Identity, record: RequestRecord, count: CountRequest
) -> Response:
    limits = await count("")
    params = request.query_params
    limit = int_param(params.get("limit"), 10_000, 1, 10_000, "limit")
    order = params.get("order", "desc")
    if order not in ("asc", "desc"):
        raise bad_request("`order` must be `asc` or `desc`.", "order")
    purpose = params.get("purpose")
    store = service_of(request).store
    files, more = await store.files(
        identity.name, purpose=purpose, after=params.get("after"), limit=limit,
        newest_first=order == "desc", hidden=ANTHROPIC_RESULTS_PURPOSE,
    )  # fmt: skip
    return json_response(page([file_object(f) for f in files], more), limits)


def page(data: list[dict[str, object]], more: bool) -> dict[str, object]:
    """OpenAI's cursor page: the SDK takes the next cursor from the last item's id."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": more,
    }


def int_param(value: str | None, default: int, low: int, high: int, name: str) -> int:
    if value is None:
        return default
    if not value.isdecimal() or not low <= int(value) <= high:
        raise bad_request(f"`{name}` must be an integer from {low} to {high}.", name)
    return int(value)


async def _retrieve(
    request: Request, identity: Identity, record: RequestRecord, count: CountRequest
) -> Response:
    limits = await count("")
    file = await visible_file(request, identity, request.path_params["file_id"])
    return json_response(file_object(file), limits)


async def _content(
    request: Request, identity: Identity, record: RequestRecord, count: CountRequest
) -> Response:
    limits = await count("")
    file = await visible_file(request, identity, request.path_params["file_id"])
    return StreamingResponse(
        service_of(request).objects.get(file.object_key),
        headers=limits,
        media_type="application/octet-stream",
    )


async def _delete(
    request: Request, identity: Identity, record: RequestRecord, count: CountRequest
) -> Response:
    limits = await count("")
    file_id = request.path_params["file_id"]
    await visible_file(request, identity, file_id)
    service = service_of(request)
    deleted = await service.store.delete_file(identity.name, file_id, time.time())
    if deleted is None:
        raise file_not_found(file_id)
    await service.objects.delete(deleted.object_key)
    return json_response({"id": file_id, "object": "file", "deleted": True}, limits)
