"""Metrics as operators see them: several workers add up, and a real Prometheus scrapes."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import orjson
import pytest
import yaml

from gateway_tools.dev.processes import free_port, stop, wait_http_ok, wait_listening
from gateway_tools.dev.sim.server import TritonSim
from tests import ports
from tests.e2e.stack import Gateway, model, start_gateway, tenant
from tests.e2e.test_rate_limits import chat


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def served(exposition: str) -> float:
    """gateway_requests_total of tenant `ops` with status 200, summed over series."""
    total = 0.0
    for line in exposition.splitlines():
        wanted = 'tenant="ops"' in line and 'status="200"' in line
        if line.startswith("gateway_requests_total{") and wanted:
            total += float(line.split()[-1])
    return total


@pytest.fixture(scope="module")
def two_workers(
    sims: tuple[TritonSim, TritonSim], redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    models = {"llm-small": model("triton_grpc", [sims[0].grpc_target])}
    gw = start_gateway(
        tmp_path_factory.mktemp("workers"),
        models,
        redis_url,
        tenants={"ops": tenant("ops", ["*"], admin=True)},
        workers=2,
    )
    try:
        yield gw
    finally:
        stop(gw.process)


async def test_metrics_add_up_across_worker_processes(two_workers: Gateway) -> None:
    async with aiohttp.ClientSession() as session:
        statuses = await asyncio.gather(*(chat(session, two_workers, "ops") for _ in range(30)))
    assert [s for s, _, _ in statuses] == [200] * 30
    # Each scrape lands on either worker; every one must see all 30 requests.
    assert {served(fetch(f"{two_workers.ops_url}/metrics")) for _ in range(8)} == {30.0}


def test_a_real_prometheus_scrapes_the_gateway(two_workers: Gateway, tmp_path: Path) -> None:
    binary = shutil.which("prometheus")
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail("prometheus is not installed (scripts/bootstrap.sh installs it)")
        pytest.skip("prometheus is not installed")
    # As docs/operations.md shows: the ops listener without a key, or the API port with
    # an admin tenant's key.
    ops_target = two_workers.ops_url.removeprefix("http://")
    api_target = two_workers.url.removeprefix("http://")
    config = {
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [
            {"job_name": "ops", "static_configs": [{"targets": [ops_target]}]},
            {
                "job_name": "api",
                "authorization": {"credentials": "sk-test-ops"},
                "static_configs": [{"targets": [api_target]}],
            },
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port(start=ports.PROMETHEUS, end=ports.OWN_REDIS)
    process = subprocess.Popen(
        [binary, f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        wait_listening(process, port, "prometheus", timeout_s=30)
        # It listens before it is ready (503 until its storage is open).
        wait_http_ok(f"http://127.0.0.1:{port}/-/ready", timeout_s=30, process=process)
        query = "sum%20by%20(job)%20(gateway_requests_total{tenant=%22ops%22,status=%22200%22})"
        deadline = time.monotonic() + 30
        values: dict[str, float] = {}
        while time.monotonic() < deadline and len(values) < 2:
            answer = orjson.loads(fetch(f"http://127.0.0.1:{port}/api/v1/query?query={query}"))
            values = {r["metric"]["job"]: float(r["value"][1]) for r in answer["data"]["result"]}
            time.sleep(0.5)
    finally:
        stop(process)
    assert set(values) == {"ops", "api"}
    assert values["ops"] >= 30 and values["api"] >= 30
