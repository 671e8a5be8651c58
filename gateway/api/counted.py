"""The endpoints that ask for no inference, served as every request is: one record
each, `x-request-id`, and one count against the tenant's request limit."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from starlette.background import BackgroundTask
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response

from gateway.api import errors
from gateway.api.endpoints import conductor_of, runtime_of
from gateway.api.errors import APIError
from gateway.api.wire import bearer
from gateway.inference.ids import random_id
from gateway.observability.access import RequestRecord
from gateway.serving.auth import Identity
from gateway.transport.streaming import ClientGone

# Counts the request against its tenant's request limit (and `model`'s, if given): the
# rate-limit headers its answer carries (`Conductor.count`).
CountRequest = Callable[[str], Awaitable[dict[str, str]]]
# An endpoint that asks for no inference: the request, who asks, its record, its count.
Counted = Callable[[Request, Identity, RequestRecord, CountRequest], Awaitable[Response]]


async def serve_counted(
    request: Request,
    endpoint: str,
    handle: Counted,
    credentials: Callable[[Headers], str | None] = bearer,
    render_error: Callable[[APIError], Response] | None = None,
) -> Response:
    """Serve a request that asks for no inference (`count_tokens`, a stored response read
    or deleted) as every request is served: it ends in one record (`endpoint` names it
    in the metrics and the access line), its answer carries `x-request-id`, and it
    counts against the tenant's request limit once: by `handle`'s own count, or, for a
    refusal before it, as a refused request is counted."""
    record = RequestRecord(
        "req_" + random_id(), endpoint=endpoint, sink=runtime_of(request).record_sink
    )
    try:
        conductor = conductor_of(request)
        identity = await runtime_of(request).auth.authenticate(credentials(request.headers))
        record.tenant, record.key_id = identity.name, identity.key_id
        counted = False

        async def count(model: str = "") -> dict[str, str]:
            nonlocal counted
            counted = True  # a 429 from the count is itself the count
            return await conductor.count(identity, model)

        try:
            response = await handle(request, identity, record, count)
        except errors.CLIENT_ERRORS as exc:
            error = errors.client_error(exc)
            if not counted:
                error.headers.update(await conductor.count_refused(identity, record, error.status))
            if error is exc:
                raise
            raise error from exc
    except errors.CLIENT_ERRORS as exc:
        error = errors.client_error(exc)
        record.finish(error.status, error.reason)
        error.headers["x-request-id"] = record.request_id
        return error.response() if render_error is None else render_error(error)
    except ClientGone:
        record.finish(499)
        return Response(status_code=499)
    except asyncio.CancelledError:
        record.finish(499)
        raise
    except Exception:
        record.finish(500)
        raise
    response.headers["x-request-id"] = record.request_id
    response.background = BackgroundTask(_answered, record, response.status_code)
    return response


async def _answered(record: RequestRecord, status: int) -> None:
    # Run once the answer is sent, on the loop (a plain function would go to a thread).
    record.finish(status)
