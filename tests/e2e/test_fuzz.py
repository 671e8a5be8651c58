"""The live gateway fuzzed from its own OpenAPI document (schemathesis, bounded): every
answer is a 2xx or a 4xx, never a 5xx, a hang or a traceback in its log."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway_tools.dev.processes import stop
from gateway_tools.dev.sim.server import TritonSim
from tests.e2e.stack import KEYS, Gateway, default_tenants, model, start_gateway

# Test cases per operation and phase: about 7,800 test cases in all, in about a minute.
# A deeper run for a change to the request parsers: GATEWAY_FUZZ_EXAMPLES=1000 (3.5 min).
EXAMPLES = int(os.environ.get("GATEWAY_FUZZ_EXAMPLES", "300"))


@pytest.fixture(scope="module")
def fuzzed(
    sims: tuple[TritonSim, TritonSim], redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    a, _ = sims
    # Short answers: the fuzzer's valid requests come back fast.
    short = {"upstream_model": "llm-small", "max_tokens_limit": 8, "max_tokens_default": 4}
    models = {
        "fuzz-http": model("triton_http", [a.http_url], **short),
        "fuzz-grpc": model("triton_grpc", [a.grpc_target], **short),
        "fuzz-embed": model(
            "triton_http", [a.http_url], upstream_model="embed-small",
            capabilities={"embeddings": {"dimensions": 256, "shortenable": True}},
        ),
    }  # fmt: skip
    tmp = tmp_path_factory.mktemp("fuzz")
    gateway = start_gateway(
        tmp,
        models,
        redis_url,
        tenants=default_tenants([]),
        # The Batch APIs too: their paths are in the document when they are served.
        gateway={
            "ledger": {"url": f"sqlite:///{tmp}/usage.db", "spool_dir": str(tmp / "spool")},
            "batches": {"files_dir": str(tmp / "files")},
        },
    )
    try:
        yield gateway
    finally:
        stop(gateway.process)


def test_no_request_reaches_a_server_error(fuzzed: Gateway, tmp_path: Path) -> None:
    schemathesis = Path(sys.executable).with_name("schemathesis")
    run = subprocess.run(
        [
            str(schemathesis), "run", f"{fuzzed.url}/openapi.json",
            "--checks", "not_a_server_error",
            "--max-examples", str(EXAMPLES),
            "--header", f"Authorization: Bearer {KEYS['acme']}",
            "--seed", "20261130",
            "--generation-database", "none",
            "--request-timeout", "30",
            "--workers", "1",  # ast.parse in threads trips CPython 3.11 (SystemError)
            "--no-color",
            "--report", "ndjson", "--report-dir", str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,  # its own files (.schemathesis/) go there
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    # Its statistics (operations, test cases, checks), for the CI log (`pytest -s`).
    print(run.stdout[run.stdout.rfind("Operations") :] if "Operations" in run.stdout else "")
    log = fuzzed.log
    assert "Traceback" not in log
    # It did send what it says: the gateway logged every completion request.
    assert log.count('"logger":"gateway.access"') >= 2 * EXAMPLES
