"""Prometheus rules (config/alerts) and the Grafana dashboard (config/grafana).

The rules are checked and unit-tested with `promtool` (Debian package `prometheus`).
Without promtool the rule tests fail on CI (CI=true) and are skipped elsewhere; the
dashboard's JSON checks need nothing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "config" / "alerts"
RULES = ALERTS / "gateway.rules.yaml"
RULE_TESTS = sorted((ALERTS / "tests").glob("*.yaml"))
DASHBOARD = ROOT / "config" / "grafana" / "gateway.json"

# Every alert the rules file must define (and the tests must cover).
ALERT_NAMES = {
    "GatewayTenantHigh429Ratio",
    "GatewayQueueWaitOverObjective",
    "GatewayModelThroughputBelowBaseline",
    "GatewayReplicaThroughputBelowBaseline",
    "GatewayReplicaDown",
    "GatewayModelNoHealthyReplica",
    "GatewayReplicaEjected",
    "GatewayReplicaEjectionsRepeated",
    "GatewayRateLimiterRedisDown",
    "GatewayConfigReloadRejected",
    "GatewayConfigVersionDrift",
}


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        message = "promtool not found (apt-get install prometheus)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_promtool(), *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_promtool_check_rules() -> None:
    result = _run("check", "rules", str(RULES.relative_to(ROOT)))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "SUCCESS" in output, output


def test_promtool_test_rules() -> None:
    assert RULE_TESTS, "no promtool tests in config/alerts/tests"
    result = _run("test", "rules", *(str(p.relative_to(ROOT)) for p in RULE_TESTS))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "FAILED" not in output, output
    assert output.count("SUCCESS") == len(RULE_TESTS), output


def test_every_alert_is_defined_and_tested() -> None:
    rules_text = RULES.read_text()
    defined = set(re.findall(r"^\s*- alert: (\w+)", rules_text, re.MULTILINE))
    assert defined == ALERT_NAMES
    tests_text = "\n".join(p.read_text() for p in RULE_TESTS)
    tested = set(re.findall(r"alertname: (\w+)", tests_text))
    assert tested == ALERT_NAMES
    # Each alert has a firing case (exp_alerts with entries) and a quiet case (exp_alerts: []).
    for name in ALERT_NAMES:
        cases = re.findall(
            rf"alertname: {name}\n\s*exp_alerts:( \[\]|\n)", tests_text, re.MULTILINE
        )
        assert " []" in cases, f"{name}: no quiet case"
        assert "\n" in cases, f"{name}: no firing case"


def test_every_alert_has_severity_and_annotations() -> None:
    text = RULES.read_text()
    blocks = re.split(r"^\s*- (?=alert: |record: )", text, flags=re.MULTILINE)
    alerts = [b for b in blocks if b.startswith("alert: ")]
    assert len(alerts) == len(ALERT_NAMES)
    for block in alerts:
        name = block.split()[1]
        assert re.search(r"severity: (critical|warning|info)\b", block), name
        for key in ("summary:", "description:", "runbook:"):
            assert key in block, f"{name}: no {key}"


def _dashboard() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return dashboard


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    panels: list[dict[str, Any]] = []
    for panel in dashboard["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))
    return [p for p in panels if p.get("type") != "row"]


def test_dashboard_is_well_formed() -> None:
    dashboard = _dashboard()
    assert 36 <= dashboard["schemaVersion"] <= 41
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("tenant", "model"):
        assert variables[name]["type"] == "query"
        assert variables[name]["definition"].startswith("label_values(")
    panels = _panels(dashboard)
    assert len(panels) >= 15
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    for panel in panels:
        title = panel.get("title")
        assert title, panel
        assert panel["datasource"]["uid"] == "${datasource}", title
        assert panel["targets"], title
        for target in panel["targets"]:
            assert target["expr"].strip(), title
            assert target["datasource"]["uid"] == "${datasource}", title


def test_dashboard_covers_every_metric_and_recording_rule() -> None:
    exprs = "\n".join(t["expr"] for p in _panels(_dashboard()) for t in p["targets"])
    for metric in (
        "gateway_requests_total",
        "gateway_refusals_total",
        "gateway_queue_wait_seconds",
        "gateway_time_to_first_token_seconds",
        "gateway_request_duration_seconds",
        "gateway_tokens_total",
        "gateway_replica_tokens_total",
        "gateway_replica_requests_total",
        "gateway_replica_healthy",
        "gateway_replica_ejected",
        "gateway_replica_ejections_total",
        "gateway_fallbacks_total",
        "gateway_retries_total",
        "gateway_retry_budget_exhausted_total",
        "gateway_ratelimit_redis_up",
        "gateway_ratelimit_fallback_decisions_total",
        "gateway_redis_errors_total",
        "gateway_redis_duration_seconds",
        "gateway_redis_calls_per_round_trip",
        "gateway_streams_cut_total",
        "gateway_config_reloads_total",
        "gateway_config_info",
        "gateway_admission_in_flight",
        "gateway_admission_queued",
        "gateway_triton_pending_requests",
    ):
        # Directly, or through a recording rule (`level:gateway_x:op` drops `_total`).
        assert metric.removesuffix("_total") in exprs, f"{metric} not on the dashboard"
    # Recording rules used by the dashboard exist in the rules file.
    rules_text = RULES.read_text()
    for record in set(re.findall(r"\b\w+:\w+:\w+\b", exprs)):
        assert f"record: {record}\n" in rules_text, record


def test_dashboard_queries_parse(tmp_path: Path) -> None:
    """Every panel query, with Grafana variables filled in, is valid PromQL for promtool."""
    substitutions = {"$__rate_interval": "5m", "$tenant": ".*", "$model": ".*"}
    lines = ["groups:", "  - name: dashboard", "    rules:"]
    for i, panel in enumerate(_panels(_dashboard())):
        for j, target in enumerate(panel["targets"]):
            expr = target["expr"]
            for var, value in substitutions.items():
                expr = expr.replace(var, value)
            assert "$" not in expr, expr
            lines.append(f"      - record: dashboard:panel{i}:target{j}")
            lines.append(f"        expr: {json.dumps(expr)}")
    rules = tmp_path / "dashboard.rules.yaml"
    rules.write_text("\n".join(lines) + "\n")
    result = _run("check", "rules", str(rules))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "SUCCESS" in output, output
