"""What a started server has imported: its own program and its libraries, nothing of the
control plane or the offline tools (issue 41: "`gateway serve` loads no module of the
other two programs").

Python's own record of every import (`PYTHONPROFILEIMPORTTIME`, to the gateway's log)
is read after the server has answered a whole and a streamed chat, so that what the
request path imports on first use is counted too.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from gateway_tools.dev.processes import stop
from gateway_tools.dev.sim.server import TritonSim
from tests.e2e.stack import KEYS, default_tenants, model, start_gateway

# A line of `-X importtime`: "import time: <self us> | <cumulative us> | <indent><name>".
IMPORT_LINE = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*([\w.]+)\s*$")
# The other programs, libraries that only they use, and the Kubernetes client (a server
# whose config names nothing of Kubernetes does not load it: 0.2 s of its start).
NOT_IN_A_SERVER = (
    "gateway_control",
    "gateway_tools",
    "matplotlib",
    "pytriton",
    "openai",
    "kubernetes_asyncio",
)


def imported(log: str) -> set[str]:
    """The modules an importtime log names."""
    return {match[1] for line in log.splitlines() if (match := IMPORT_LINE.match(line))}


def test_a_started_server_imports_nothing_of_the_other_programs(
    sims: tuple[TritonSim, TritonSim], redis_url: str, tmp_path: Path
) -> None:
    a, _ = sims
    models = {"llm-large": model("triton_http", [a.http_url])}
    gateway = start_gateway(
        tmp_path,
        models,
        redis_url,
        tenants=default_tenants(["llm-large"]),
        env={"PYTHONPROFILEIMPORTTIME": "1"},
    )
    try:
        headers = {"authorization": f"Bearer {KEYS['acme']}"}
        body = {"model": "llm-large", "messages": [{"role": "user", "content": "Hi"}]}
        url = gateway.base_url + "/chat/completions"
        assert httpx.post(url, json=body, headers=headers, timeout=30).status_code == 200
        streamed = httpx.post(url, json={**body, "stream": True}, headers=headers, timeout=30)
        assert streamed.status_code == 200 and "[DONE]" in streamed.text
    finally:
        stop(gateway.process)
    modules = imported(gateway.log)
    assert "gateway.serving.conductor" in modules  # the record is read whole
    assert sorted(m for m in modules if m.split(".")[0] in NOT_IN_A_SERVER) == []
    # A server that does not trace loads nothing of tracing's SDK or its exporters
    # (redis-py imports OpenTelemetry's API and metrics on its own, when installed).
    tracing = (
        "opentelemetry.sdk.trace",
        "opentelemetry.exporter",
        "gateway.observability.trace_export",
    )
    assert sorted(m for m in modules if m.startswith(tracing)) == []
