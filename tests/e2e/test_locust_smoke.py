"""loadtest/locustfile.py against a real gateway: every user class runs, nothing fails,
and the bursty tenant's 429s are counted as refusals rather than failures."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gateway_tools.dev.processes import stop
from gateway_tools.dev.sim.server import TritonSim
from tests.e2e.stack import model, start_gateway, tenant

ROOT = Path(__file__).resolve().parents[2]
LOCUSTFILE = ROOT / "loadtest" / "locustfile.py"


def locust_command(host: str, csv_prefix: Path, run_time: str, *user_classes: str) -> list[str]:
    """The headless run of the brief, with the venv's own locust."""
    locust = Path(sys.executable).with_name("locust")
    return [
        str(locust), "-f", str(LOCUSTFILE), "--headless", "-u", "12", "-r", "6",
        "-t", run_time, "--host", host, "--only-summary", "--csv", str(csv_prefix),
        *user_classes,
    ]  # fmt: skip


def test_locust_smoke_run_exits_0_with_refusals_but_no_failures(
    sims: tuple[TritonSim, TritonSim], redis_url: str, tmp_path: Path
) -> None:
    a, b = sims
    models = {
        "llm-large": model("triton_http", [a.http_url, b.http_url]),
        "llm-small": model("triton_grpc", [a.grpc_target]),
    }
    tenants = {
        "acme": tenant("acme", ["llm-large", "llm-small"], priority="online"),
        "globex": tenant("globex", ["llm-small"], priority="batch"),
        # Low limits, so that every burst of 12 meets them.
        "spiky": tenant(
            "spiky",
            ["llm-small"],
            priority="batch",
            limits={"requests_per_minute": 30, "burst_requests": 6, "max_concurrent": 4},
        ),
    }
    gw = start_gateway(tmp_path / "gateway", models, redis_url, tenants=tenants)
    try:
        users = {
            "interactive": {"key": "${SMOKE_ACME_KEY}", "model": "llm-large", "max_tokens": 8},
            "batch": {"key": "sk-test-globex", "model": "llm-small", "max_tokens": 32},
            "bursty": {"key": "sk-test-spiky", "model": "llm-small", "max_tokens": 4, "burst": 12},
        }
        tenants_file = tmp_path / "locust-tenants.yaml"
        tenants_file.write_text(yaml.safe_dump({"users": users}))
        env = {**os.environ, "LOCUST_TENANTS": str(tenants_file), "SMOKE_ACME_KEY": "sk-test-acme"}
        command = locust_command(gw.url, tmp_path / "smoke", "8s")
        run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
        # And the exit code does tell: a key the gateway does not know gives 401s, which
        # are failures, and so exit code 1.
        users["interactive"]["key"] = "sk-test-nobody"
        tenants_file.write_text(yaml.safe_dump({"users": users}))
        short = locust_command(gw.url, tmp_path / "unknown", "2s", "InteractiveChatUser")
        bad = subprocess.run(short, env=env, capture_output=True, text=True, timeout=60)
    finally:
        stop(gw.process)
    output = run.stdout + run.stderr
    print(output)  # the summary table, for `pytest -s`
    assert run.returncode == 0, output
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "HTTP 401" in bad.stdout + bad.stderr

    with (tmp_path / "smoke_stats.csv").open() as f:
        rows = {(r["Type"], r["Name"]): r for r in csv.DictReader(f)}
    counts = {k: int(r["Request Count"]) for k, r in rows.items()}
    failures = {k: int(r["Failure Count"]) for k, r in rows.items()}
    # Every user class sent requests, and the streamed chats were timed.
    for entry in [
        ("POST", "chat (stream)"),
        ("POST", "completion (batch)"),
        ("POST", "chat (burst)"),
        ("TTFT", "llm-large"),
        ("TOKENS/S", "llm-large"),
    ]:
        assert counts.get(entry, 0) > 0, (entry, counts, output)
    assert sum(failures.values()) == 0, (failures, output)
    # Only the bursty tenant has limits, so every 429 is one of its refusals.
    assert counts.get(("REFUSED", "429"), 0) > 0, (counts, output)


@pytest.mark.parametrize("reference", ["${SMOKE_KEY}", "${SMOKE_UNSET:-sk-fallback}"])
def test_tenants_file_keys_may_be_env_references(
    reference: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys are resolved from the environment, so the file need not hold them."""
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({"users": {"batch": {"key": reference, "model": "m"}}}))
    env = {k: v for k, v in os.environ.items() if k != "SMOKE_UNSET"}
    env.update(LOCUST_TENANTS=str(path), SMOKE_KEY="sk-from-env")
    # In a child process: importing locust monkey-patches the interpreter with gevent.
    script = (
        f"import runpy; p = runpy.run_path({str(LOCUSTFILE)!r})['PROFILES'];"
        "print(p['batch'].key, p['batch'].model, p['interactive'].key)"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=30
    )
    assert run.returncode == 0, run.stderr
    expected = "sk-from-env" if reference == "${SMOKE_KEY}" else "sk-fallback"
    # Unnamed users keep the demo's tenant.
    assert run.stdout.split() == [expected, "m", "sk-acme-demo"]
