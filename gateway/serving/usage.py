"""Every finished request into the usage ledger, priced (issue 27).

`RequestRecord.finish` hands each request's record here (the runtime gives each record
`UsageLedger.record` as its sink when the request arrives); it becomes a `UsageRecord`,
its cost from the price table, and goes to the ledger's writer, which takes it in O(1)
and writes it later, in batches, off the request path (`gateway.ledger`).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from gateway.config.ledger_config import LedgerConfig
from gateway.config.schema import Price, Prices
from gateway.ledger.ledger_writer import LedgerStats, LedgerWriter, start_ledger
from gateway.ledger.usage_records import UsageRecord
from gateway.ledger.usage_spool import SpoolInUse
from gateway.observability import metrics
from gateway.observability.access import RequestRecord

log = logging.getLogger("gateway")

# Workers of one gateway take a spool directory each, the first free one of these
# (`spool_dir/0`, `/1`, ...): a restarted worker finds what the one before it left.
MAX_WORKERS = 64


class UsageLedger:
    """The running gateway's ledger: prices a finished request and records it."""

    def __init__(self, writer: LedgerWriter, prices: Prices) -> None:
        self.writer = writer
        self._prices = prices.models

    def record(self, request: RequestRecord, duration_s: float) -> None:
        """A finished request's usage record, priced by the model that served it."""
        self.writer.record(self._usage_record(request, duration_s, request.status))

    def in_flight(
        self, request: RequestRecord, status: int = 0, prompt_tokens: int | None = None
    ) -> None:
        """A request on its way, as far as it has got: dispatched (status 0, with the
        `prompt_tokens` sent), part of a stream relayed, or answered (`status`) and not
        yet sent. The journal holds it until its final record comes: if this process
        ends first, the next one records it from this (`gateway.ledger.usage_journal`)."""
        duration_s = time.perf_counter() - request.started
        record = self._usage_record(request, duration_s, status)
        if prompt_tokens is not None:
            # Dispatched, nothing seen yet: what it is recorded at if this process ends
            # now is its prompt at the model it named (a replica had it, or was about to).
            record.prompt_tokens = prompt_tokens
            record.model_served = record.model_served or request.model
            price = self._prices.get(record.model_served)
            record.cost_micros = 0 if price is None else price.cost_micros(prompt_tokens, 0, 0)
        # An answer about to be sent is on disk first.
        self.writer.in_flight(record, now=status != 0)

    def _usage_record(self, request: RequestRecord, duration_s: float, status: int) -> UsageRecord:
        price = self._prices.get(request.served_model) if request.served_model else None
        cost = request.cost_micros or 0
        if request.cost_micros is None and price is not None:
            cost = price.cost_micros(
                request.prompt_tokens, request.cached_tokens, request.completion_tokens
            )
        return UsageRecord(
            ts=time.time(),
            request_id=request.request_id,
            tenant=request.tenant,
            key_id=request.key_id,
            endpoint=request.endpoint,
            model_requested=request.alias or request.model,
            model_served=request.served_model,
            prompt_tokens=request.prompt_tokens,
            cached_tokens=request.cached_tokens,
            completion_tokens=request.completion_tokens,
            cost_micros=cost,
            latency_ms=duration_s * 1000,
            status=status,
            fallback="; ".join(request.fallbacks),
            ttft_ms=None if request.ttft_s is None else request.ttft_s * 1000,
            batch_id=request.batch_id,
            bytes_in=request.bytes_in,
            bytes_out=request.bytes_out,
            outcome=request.outcome or request.reason,
        )

    async def close(self) -> None:
        """No more records; what is waiting is written (or spooled)."""
        await self.writer.close()


def discounted(prices: Prices) -> dict[str, Price]:
    """The price table a Batch API line pays: every price at `prices.batch_discount`."""
    share = prices.batch_discount
    return {
        model: Price(
            input_per_million=price.input_per_million * share,
            cached_input_per_million=None
            if price.cached_input_per_million is None
            else price.cached_input_per_million * share,
            output_per_million=price.output_per_million * share,
        )
        for model, price in prices.models.items()
    }


class _Reporter:
    """The writer's counts (since it started) into the metrics, as what is new."""

    def __init__(self) -> None:
        self._written = 0
        self._dropped = 0

    def __call__(self, stats: LedgerStats) -> None:
        metrics.observe_ledger(
            stats.buffered,
            stats.spooled,
            stats.lag_s,
            stats.written - self._written,
            stats.dropped - self._dropped,
        )
        self._written, self._dropped = stats.written, stats.dropped


async def start_usage_ledger(config: LedgerConfig, prices: Prices) -> UsageLedger:
    """The ledger of `config`, started: each request's record goes to its `record` (the
    runtime hands it to each `RequestRecord` as its sink)."""
    base = Path(config.spool_dir)
    for index in range(MAX_WORKERS):
        worker_config = config.model_copy(update={"spool_dir": str(base / str(index))})
        reporter = _Reporter()
        try:
            writer = await start_ledger(worker_config, reporter)
        except SpoolInUse:
            continue  # another worker's
        return UsageLedger(writer, prices)
    raise SpoolInUse(f"every spool directory under {base} is in use ({MAX_WORKERS} workers)")
