"""The Batch APIs' running parts, one per gateway process: the store, the object store,
the worker, and what making a batch shares between the two APIs (its lines checked
against the caller's models, recorded, the worker woken)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import orjson
from starlette.requests import Request

from gateway.api.anthropic import MESSAGES
from gateway.api.batch_apis.line_runner import LineRunner
from gateway.api.errors import APIError
from gateway.api.openai import CHAT, COMPLETIONS, EMBEDDINGS
from gateway.api.responses import RESPONSES
from gateway.api.wire import Wire
from gateway.batches.batch_input import BatchLine, LineError
from gateway.batches.batch_records import (
    OUTPUT_TTL_S,
    BatchApi,
    BatchRecord,
    BatchStatus,
    LineCounts,
    NewLine,
)
from gateway.batches.batch_store import BatchStore
from gateway.batches.batch_worker import BatchWorker, WorkerSettings
from gateway.batches.idle_slots import AdmissionIdleSlots
from gateway.batches.object_store import DirectoryStore, ObjectStore
from gateway.config.schema import BatchesConfig
from gateway.inference.ids import random_id
from gateway.observability import metrics
from gateway.serving.auth import Identity
from gateway.serving.conductor import Conductor
from gateway.serving.errors import ModelNotAllowed, UnknownModel

if TYPE_CHECKING:
    from gateway.serving.runtime import Runtime

# The endpoints a batch may run: the gateway's own.
OPENAI_ENDPOINTS: dict[str, Wire] = {
    "/v1/chat/completions": CHAT,
    "/v1/completions": COMPLETIONS,
    "/v1/embeddings": EMBEDDINGS,
    "/v1/responses": RESPONSES,
}
MESSAGES_ENDPOINT = "/v1/messages"


class BatchService:
    """The Batch APIs of one gateway process."""

    def __init__(
        self,
        config: BatchesConfig,
        runtime: Runtime,
        conductor: Conductor,
        store: BatchStore,
        objects: ObjectStore,
    ) -> None:
        self.config, self.store, self.objects = config, store, objects
        self._runtime, self._conductor = runtime, conductor
        wires = {**OPENAI_ENDPOINTS, MESSAGES_ENDPOINT: MESSAGES}
        self.worker = BatchWorker(
            store,
            objects,
            LineRunner(runtime, conductor, wires),
            AdmissionIdleSlots(runtime.admission, config.reserve_slots),
            WorkerSettings(
                poll_s=config.poll_interval_s,
                housekeeping_s=config.housekeeping_interval_s,
                lease_s=config.lease_s,
                max_lines=config.max_lines_per_gateway,
            ),
            self._tenant_limit,
        )
        # Making a batch reads and checks its whole input (up to 200 MB): one at a time
        # per process, so that a tenant's many creates cannot hold the memory of many.
        self.making = asyncio.Semaphore(1)

    @classmethod
    def build(cls, runtime: Runtime, conductor: Conductor) -> BatchService | None:
        """The service gateway.yaml's `batches:` asks for (None: not served)."""
        config = runtime.config.gateway.batches
        if config is None:
            return None
        url = config.database_url
        if url is None:
            ledger = runtime.config.gateway.ledger
            assert ledger is not None  # the loader refuses `batches:` without either
            url = ledger.url
        objects: ObjectStore
        if config.s3 is not None:
            from gateway.batches.s3_object_store import S3Store

            objects = S3Store(config.s3)
        else:
            objects = DirectoryStore(config.files_dir)
        return cls(config, runtime, conductor, BatchStore(url), objects)

    def start(self) -> None:
        """Start this process's worker."""
        self.worker.start()

    async def close(self) -> None:
        """Stop the worker (its lines given back) and release the stores."""
        await self.worker.stop()
        await self.store.close()
        await self.objects.close()

    def _tenant_limit(self, tenant: str) -> int | None:
        config = self._runtime.config.tenants.tenants.get(tenant)
        return 0 if config is None else config.batch.max_concurrent_lines

    def lines_of(
        self, identity: Identity, requests: Sequence[BatchLine | LineError]
    ) -> tuple[list[NewLine], tuple[str, ...]]:
        """Each request as a line to store: to run, or failed already (not well formed, a
        model unknown or not the caller's, `stream`); and the models they run on. In
        input order."""
        lines: list[NewLine] = []
        models: set[str] = set()
        for request in requests:
            if isinstance(request, LineError):
                lines.append(
                    _failed(request.line, request.custom_id or "", request.code, request.message)
                )
                continue
            route = _route_of(self._conductor, identity, request)
            if isinstance(route, str):
                models.add(route)
                lines.append(NewLine(request.line, request.custom_id, route, request.body))
            else:
                lines.append(_failed(request.line, request.custom_id, *route))
        lines.sort(key=lambda line: line.line_no)
        return lines, tuple(sorted(models))

    async def make(
        self,
        identity: Identity,
        api: BatchApi,
        endpoint: str,
        input_file_id: str,
        lines: list[NewLine],
        models: tuple[str, ...],
        metadata: dict[str, str] | None,
        output_ttl_s: float = OUTPUT_TTL_S,
    ) -> BatchRecord:
        """Record a new batch in progress and wake the worker."""
        await self.refuse_past_open_limit(identity)
        now = time.time()
        batch = BatchRecord(
            id=("msgbatch_" if api is BatchApi.ANTHROPIC else "batch_") + random_id(),
            api=api,
            tenant=identity.name,
            key_id=identity.key_id,
            endpoint=endpoint,
            input_file_id=input_file_id,
            completion_window="24h",
            status=BatchStatus.IN_PROGRESS,
            created_at=now,
            expires_at=now + self.config.window_s,
            counts=LineCounts(total=len(lines)),
            models=models,
            metadata=metadata,
            in_progress_at=now,
            output_ttl_s=output_ttl_s,
        )
        await self.store.create_batch(batch, lines)
        metrics.labels(metrics.BATCHES_CREATED, api.value).inc()
        self.worker.wake()
        recorded = await self.store.batch(identity.name, batch.id, api)
        assert recorded is not None
        return recorded

    async def cancel(self, batch: BatchRecord) -> None:
        """Cancel `batch` (`NotCancellable` once it has ended); the worker sees it now."""
        cancelled = await self.store.cancel(batch.tenant, batch.id, batch.api, time.time())
        metrics.labels(metrics.BATCH_LINES, "cancelled").inc(cancelled)
        self.worker.wake()

    async def refuse_past_open_limit(self, identity: Identity) -> None:
        """429 when the caller's tenant has `max_batches_per_tenant` batches open."""
        limit = self.config.max_batches_per_tenant
        if await self.store.open_batches(identity.name) >= limit:
            raise APIError(
                429,
                f"Your tenant has {limit} batches in progress, the most it may have; "
                "wait for one to end or cancel one.",
                type="rate_limit_error",
                code="batch_limit_reached",
                headers={"x-should-retry": "false"},
            )


def service_of(request: Request) -> BatchService:
    """The app's batch service; a 404 (as any unknown path) when batches are not served."""
    service: BatchService | None = getattr(request.app.state, "batches", None)
    if service is None:
        raise APIError(
            404, f"Invalid URL ({request.method} {request.url.path}).", code="unknown_url"
        )
    return service


def _route_of(
    conductor: Conductor, identity: Identity, request: BatchLine
) -> str | tuple[str, str]:
    """The route a request runs on, or why it cannot run (code, message)."""
    if request.streams:
        return "streaming_unsupported", "A batch's requests cannot stream."
    model = request.model
    if not isinstance(model, str) or not model:
        return "invalid_request", "The request's body has no `model`."
    try:
        return conductor.authorize(identity, model).name
    except UnknownModel:
        return "model_not_found", f"The model `{model[:256]}` does not exist."
    except ModelNotAllowed:
        return "model_not_allowed", f"Your API key may not use the model `{model[:256]}`."


def _failed(line_no: int, custom_id: str, code: str, message: str) -> NewLine:
    problem = orjson.dumps({"code": code, "message": message}).decode()
    return NewLine(line_no, custom_id, "", "", failed=problem)
