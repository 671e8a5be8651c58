"""Prometheus rules (config/alerts), the Grafana dashboard (config/grafana) and
docs/operations.md, against each other and the metrics the code defines.

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
import yaml

from gateway.observability import metrics

ROOT = Path(__file__).resolve().parents[3]
ALERTS = ROOT / "config" / "alerts"
RULES = ALERTS / "gateway.rules.yaml"
RULE_TESTS = sorted((ALERTS / "tests").glob("*.yaml"))
DASHBOARD = ROOT / "config" / "grafana" / "gateway.json"
DOCS = ROOT / "docs" / "operations.md"

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
    "GatewayReplicasUnplaced",
    "GatewayRateLimiterRedisDown",
    "GatewayConfigReloadRejected",
    "GatewayConfigVersionDrift",
    "GatewayLedgerBehind",
    "GatewayLedgerRecordsLost",
    "GatewayBudgetSoftThreshold",
    "GatewayBudgetExhausted",
    "GatewayModelBelowDesiredReplicas",
    "GatewayAutoscaleFlapping",
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


def _documented_name(name: str, kind: str) -> str:
    """How docs/operations.md names a metric family: counters with their `_total`."""
    return f"{name}_total" if kind == "counter" else name


def _series_names() -> set[str]:
    """Every series name /metrics exposes (histograms' `_bucket`/`_sum`/`_count` too)."""
    names = set()
    for name, kind in metrics.metric_families().items():
        if kind == "counter":
            names.add(f"{name}_total")
        elif kind == "histogram":
            names.update(name + suffix for suffix in ("", "_bucket", "_sum", "_count"))
        else:
            names.add(name)
    return names


# A gateway metric's name, not part of a recording rule's (`level:gateway_x:op`), nor the
# name of one of the programs' packages (`gateway_tools`, `gateway_control`).
METRIC_NAME = re.compile(r"(?<![\w:])gateway_(?!tools\b|control\b)\w+(?![\w:])")
RECORDING_RULE_NAME = re.compile(r"(?<![\w:])\w+:\w+:\w+(?![\w:])")


def _recorded() -> set[str]:
    rules = yaml.safe_load(RULES.read_text())
    return {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}


def test_dashboard_covers_every_metric_and_recording_rule() -> None:
    exprs = "\n".join(t["expr"] for p in _panels(_dashboard()) for t in p["targets"])
    for name, kind in metrics.metric_families().items():
        # Directly, or through a recording rule (`level:gateway_x:op` drops `_total`).
        assert name in exprs, f"{_documented_name(name, kind)} not on the dashboard"
    # Recording rules used by the dashboard exist in the rules file.
    assert set(RECORDING_RULE_NAME.findall(exprs)) <= _recorded()


def test_docs_describe_every_metric() -> None:
    docs = DOCS.read_text()
    for name, kind in metrics.metric_families().items():
        documented = _documented_name(name, kind)
        assert f"`{documented}`" in docs, f"{documented} not in docs/operations.md"


def test_dashboard_rules_and_docs_name_only_existing_metrics() -> None:
    """No metric or recording rule that the code or the rules file does not define."""
    series, recorded = _series_names(), _recorded()
    rules = yaml.safe_load(RULES.read_text())
    texts = {
        "dashboard": "\n".join(t["expr"] for p in _panels(_dashboard()) for t in p["targets"]),
        "rules": "\n".join(
            "\n".join([r["expr"], *r.get("annotations", {}).values()])
            for g in rules["groups"]
            for r in g["rules"]
        ),
        "rule tests": "\n".join(p.read_text() for p in RULE_TESTS),
        "docs": DOCS.read_text(),
    }
    for where, text in texts.items():
        unknown = set(METRIC_NAME.findall(text)) - series
        assert not unknown, f"{where} names metrics the gateway does not export: {unknown}"
        if where != "rule tests":
            unknown = set(RECORDING_RULE_NAME.findall(text)) - recorded
            assert not unknown, f"{where} names unknown recording rules: {unknown}"


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
