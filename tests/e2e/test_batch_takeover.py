"""Two gateways share one batch through PostgreSQL; one is killed (SIGKILL) midway: the
other takes its lines over once their leases run out, and the output holds every line
once, none lost, none twice."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
import pytest
from openai import OpenAI

from gateway_tools.dev.processes import stop
from gateway_tools.dev.sim.server import TritonSim
from tests.e2e.conftest import start_sim
from tests.e2e.stack import KEYS, model, start_gateway, tenant
from tests.postgres import own_database

LINES = 600
LEASE_S = 3


@pytest.fixture
def sim() -> Iterator[TritonSim]:
    server = start_sim("llm-small=2")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def database() -> AsyncIterator[str]:
    async with own_database("batches_kill") as url:
        yield url


async def _taken_over(url: str, batch_id: str) -> int:
    connection = await asyncpg.connect(url)
    try:
        return int(
            await connection.fetchval(
                "SELECT count(*) FROM batch_lines WHERE batch_id = $1 AND attempts > 1", batch_id
            )
        )
    finally:
        await connection.close()


def test_a_gateway_killed_midway_loses_no_line_and_answers_none_twice(
    sim: TritonSim, database: str, redis_url: str, tmp_path: Path
) -> None:
    files = tmp_path / "files"  # shared, as a bucket would be
    settings = {
        "ledger": {"url": database, "spool_dir": str(tmp_path / "spool")},
        "batches": {
            "files_dir": str(files),
            "lease_s": LEASE_S,
            "housekeeping_interval_s": 0.2,
        },
    }
    models = {
        "llm-small": model("triton_grpc", [sim.grpc_target], queue={"max_in_flight_per_replica": 4})
    }
    tenants = {"acme": tenant("acme", ["*"])}
    first = start_gateway(tmp_path / "a", models, redis_url, tenants=tenants, gateway=settings)
    second = None
    try:
        second = start_gateway(tmp_path / "b", models, redis_url, tenants=tenants, gateway=settings)
        client = OpenAI(base_url=first.base_url, api_key=KEYS["acme"], max_retries=0)
        lines = [
            {
                "custom_id": f"line-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": "llm-small",
                    "max_tokens": 8,
                    "messages": [{"role": "user", "content": f"n{i}"}],
                },
            }
            for i in range(LINES)
        ]
        data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
        uploaded = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
        batch = client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        # Both gateways run its lines; the first dies with some of them in hand.
        deadline = time.monotonic() + 60
        while True:
            counts = client.batches.retrieve(batch.id).request_counts
            assert counts is not None
            if counts.completed >= LINES // 4:
                break
            assert time.monotonic() < deadline
            time.sleep(0.05)
        os.killpg(first.process.pid, signal.SIGKILL)
        first.process.wait(10)
        survivor = OpenAI(base_url=second.base_url, api_key=KEYS["acme"], max_retries=0)
        deadline = time.monotonic() + 120
        while (ended := survivor.batches.retrieve(batch.id)).status != "completed":
            assert time.monotonic() < deadline, ended.status
            time.sleep(0.2)
        assert ended.request_counts is not None
        assert (ended.request_counts.completed, ended.request_counts.failed) == (LINES, 0)
        assert ended.output_file_id is not None and ended.error_file_id is None
        output = survivor.files.content(ended.output_file_id).text.splitlines()
        ids = [json.loads(line)["custom_id"] for line in output]
        assert len(ids) == LINES and set(ids) == {f"line-{i}" for i in range(LINES)}
        # ... and the dead gateway did hold lines when it died: they were run again.
        assert asyncio.run(_taken_over(database, batch.id)) > 0
    finally:
        stop(first.process)
        if second is not None:
            stop(second.process)
