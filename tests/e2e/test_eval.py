"""`gateway eval` end to end: the shipped suite, through a real gateway, to the scripted
models (real Triton servers replaying recorded answers), judged in the sandbox.

The scripted answers say what must be found (`expect`), so pass rates are checked
exactly; the harness itself only sees two ordinary models.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gateway_tools.dev.processes import stop
from gateway_tools.dev.replay import REPLAY_DIR
from gateway_tools.eval.records import read_attempts, read_manifest
from gateway_tools.eval.suite import load_suite
from tests.e2e.conftest import start_sim
from tests.e2e.stack import Gateway, model, start_gateway, tenant

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "evals" / "suites" / "gateway-python"
CANDIDATES = ("coder-large", "coder-small")
CODER = {
    "prompt_template": "chatml", "max_tokens_default": 2048, "max_tokens_limit": 4096,
    "context_length": 32768, "timeouts": {"first_token_s": 15.0, "total_s": 120.0},
}  # fmt: skip


def expected(candidate: str) -> dict[str, bool]:
    """Task id to whether the scripted answer must pass."""
    recorded = json.loads((REPLAY_DIR / f"{candidate}.json").read_text())
    return {r["task"]: r["expect"] == "pass" for r in recorded["recordings"] if "tool" not in r}


@pytest.fixture(scope="module")
def coder_gateway(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    spec = ",".join(f"{name}=@{REPLAY_DIR / name}.json" for name in CANDIDATES)
    sim = start_sim(spec)
    try:
        models = {
            "coder-large": model("triton_http", [sim.http_url], **CODER),
            # One small replica that holds two requests and queues one: more is refused.
            "coder-small": model(
                "triton_grpc", [sim.grpc_target], **CODER,
                queue={"max_in_flight_per_replica": 2, "max_queued": 1},
            ),
        }  # fmt: skip
        tenants = {"evaluator": tenant("evaluator", list(CANDIDATES), priority="online")}
        gateway = start_gateway(
            tmp_path_factory.mktemp("eval-gw"), models, redis_url, tenants=tenants
        )
        try:
            yield gateway
        finally:
            stop(gateway.process)
    finally:
        sim.stop()


def run_eval(
    gateway: Gateway, out: Path, *extra: str, models: tuple[str, ...] = CANDIDATES
) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable, "-m", "gateway.cli", "eval", "run", "--endpoint", gateway.base_url,
        "--suite", str(SUITE), "--out", str(out), "--prices", str(ROOT / "evals" / "prices.yaml"),
        *(arg for name in models for arg in ("--model", name)), *extra,
    ]  # fmt: skip
    env = {"PATH": "/usr/bin:/bin", "GATEWAY_EVAL_KEY": "sk-test-evaluator"}
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)


@pytest.fixture(scope="module")
def finished_run(coder_gateway: Gateway, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("eval") / "run"
    result = run_eval(coder_gateway, out, "--concurrency", "2")
    assert result.returncode == 0, result.stderr
    return out


def test_every_attempt_is_judged_as_the_script_says(finished_run: Path) -> None:
    attempts = read_attempts(finished_run)
    assert len(attempts) == 2 * 15
    for candidate in CANDIDATES:
        got = {a.task: a.passed for a in attempts if a.candidate == candidate}
        assert got == expected(candidate), candidate
    large = [a for a in attempts if a.candidate == "coder-large"]
    assert sum(a.passed for a in large) == 12
    assert sum(a.passed for a in large if a.category == "cross-file") == 6


def test_each_failure_is_recorded_with_its_reason(finished_run: Path) -> None:
    by_key = {(a.candidate, a.task): a for a in read_attempts(finished_run)}
    wrong = by_key["coder-large", "09-tenant-config-error-lines"]
    assert wrong.reason is not None and wrong.reason.startswith("tests failed")
    assert wrong.tests_failed and wrong.answer_form == "files"
    broken = by_key["coder-large", "11-request-queue-cancel"]
    assert broken.reason is not None and broken.reason.startswith("answer: the diff does not apply")
    refused = by_key["coder-small", "10-usage-cached-tokens"]
    assert refused.reason is not None and "neither whole files nor a diff" in refused.reason
    diff = by_key["coder-large", "13-shared-error-body"]
    assert diff.passed and diff.answer_form == "diff" and diff.expected_files_touched


def test_answers_are_timed_counted_and_priced(finished_run: Path) -> None:
    prices = yaml.safe_load((ROOT / "evals" / "prices.yaml").read_text())["models"]
    for attempt in read_attempts(finished_run):
        assert attempt.ttft_s is not None and attempt.total_s is not None
        assert attempt.ttft_s <= attempt.total_s
        assert attempt.tokens_in > 0 and attempt.tokens_out > 0
        price = prices[attempt.candidate]
        cost = (attempt.tokens_in * price["input_per_million"]
                + attempt.tokens_out * price["output_per_million"]) / 1e6  # fmt: skip
        assert attempt.cost == pytest.approx(cost)
        assert attempt.requests.sent == 1 + attempt.requests.retries


def test_the_manifest_records_what_the_run_depended_on(finished_run: Path) -> None:
    manifest = read_manifest(finished_run)
    suite = load_suite(SUITE)
    assert manifest["suite"]["digest"] == suite.digest
    assert {t: v["digest"] for t, v in manifest["suite"]["tasks"].items()} == {
        t.id: t.digest for t in suite.tasks
    }
    assert all(v["problem"] is None for v in manifest["suite"]["tasks"].values())
    assert (
        manifest["template"]["name"] == "code-change" and len(manifest["template"]["digest"]) == 64
    )
    assert manifest["settings"]["sampling"] == {"temperature": 0.0, "max_tokens": 2048, "seed": 1}
    assert manifest["settings"]["concurrency"] == 2
    for name in CANDIDATES:
        # This gateway tells its config version for each model.
        assert manifest["candidates"][name]["listed"] is True
        assert len(manifest["candidates"][name]["config_version"]) == 12
    assert manifest["tool"]["python"].startswith("3.")
    assert manifest["finished_at"] is not None
    assert manifest["outbound"]["applied_by"] == "the gateway"


def test_an_interrupted_run_resumes_without_losing_or_repeating(
    coder_gateway: Gateway, finished_run: Path, tmp_path: Path
) -> None:
    out = tmp_path / "resumed"
    out.mkdir()
    lines = (finished_run / "attempts.jsonl").read_text().splitlines(keepends=True)
    # As a kill leaves it: 25 attempts on disk, the 26th torn mid-line, no end time.
    (out / "attempts.jsonl").write_text("".join(lines[:25]) + lines[25][:40])
    manifest = read_manifest(finished_run)
    (out / "manifest.json").write_text(json.dumps({**manifest, "finished_at": None}))
    result = run_eval(coder_gateway, out, "--concurrency", "2")
    assert result.returncode == 0, result.stderr
    assert "[26/30" in result.stderr and "[25/30" not in result.stderr
    attempts = read_attempts(out)
    assert sorted(a.key for a in attempts) == sorted(a.key for a in read_attempts(finished_run))
    assert read_manifest(out)["resumed_at"]


def test_a_run_with_other_settings_is_not_resumed_into_the_same_directory(
    coder_gateway: Gateway, finished_run: Path
) -> None:
    before = (finished_run / "attempts.jsonl").read_text()
    result = run_eval(coder_gateway, finished_run, "--temperature", "0.7")
    assert result.returncode == 2
    assert "settings.sampling" in result.stderr and "cannot be resumed" in result.stderr
    assert (finished_run / "attempts.jsonl").read_text() == before


def test_refusals_under_load_are_recorded_as_stability(
    coder_gateway: Gateway, tmp_path: Path
) -> None:
    # Four attempts at once at a model that holds three: the gateway refuses one, the
    # harness waits as Retry-After says and retries, and counts every refusal.
    tasks = ["01-token-bucket-refill", "02-duration-millisecond-units", "03-lru-cache-recency",
             "04-percentile-nearest-rank"]  # fmt: skip
    selection = [arg for task in tasks for arg in ("--task", task)]
    out = tmp_path / "busy"
    result = run_eval(coder_gateway, out, "--concurrency", "4", *selection, models=("coder-small",))
    assert result.returncode == 0, result.stderr
    attempts = read_attempts(out)
    assert sorted(a.task for a in attempts) == tasks
    assert sum(a.requests.refusals for a in attempts) > 0
    assert all(a.requests.retries == a.requests.refusals for a in attempts)
    # Refused and retried, each attempt still got its answer judged as scripted.
    script = expected("coder-small")
    assert {a.task: a.passed for a in attempts} == {task: script[task] for task in tasks}
    assert read_manifest(out)["settings"]["tasks"] == tasks


def test_the_responses_api_carries_the_same_attempt(coder_gateway: Gateway, tmp_path: Path) -> None:
    out = tmp_path / "responses"
    result = run_eval(
        coder_gateway, out, "--api", "responses", "--task", "05-sse-multiline-crlf",
        models=("coder-large",),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    [attempt] = read_attempts(out)
    assert attempt.passed and attempt.answer_form == "diff"
    assert attempt.tokens_in > 0 and attempt.tokens_out > 0 and attempt.ttft_s is not None
    assert read_manifest(out)["settings"]["api"] == "responses"


def test_a_malformed_task_is_a_recorded_failure_and_the_run_goes_on(
    coder_gateway: Gateway, tmp_path: Path
) -> None:
    suite = tmp_path / "suite"
    shutil.copytree(SUITE, suite)
    shutil.rmtree(suite / "tasks" / "02-duration-millisecond-units" / "tests")
    (suite / "tasks" / "03-lru-cache-recency" / "solution" / "promptcache" / "lru.py").write_text(
        "raise ImportError('not a solution')\n"
    )
    check = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "eval", "check-suite", str(suite)],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert check.returncode == 1
    assert "02-duration-millisecond-units: no hidden tests" in check.stdout
    assert "03-lru-cache-recency: the reference solution does not pass" in check.stdout
    assert "13 of 15 tasks ok" in check.stdout
    out = tmp_path / "run"
    tasks = ["01-token-bucket-refill", "02-duration-millisecond-units", "03-lru-cache-recency"]
    selection = [arg for task in tasks for arg in ("--task", task)]
    result = run_eval(
        coder_gateway, out, "--suite", str(suite), *selection, models=("coder-large",)
    )
    assert result.returncode == 0, result.stderr
    reasons = {a.task: a.reason for a in read_attempts(out)}
    assert reasons["01-token-bucket-refill"] is None
    assert (
        reasons["02-duration-millisecond-units"]
        == "task: no hidden tests (tests/ holds no test_*.py)"
    )
    assert (reasons["03-lru-cache-recency"] or "").startswith(
        "task: the reference solution does not pass the hidden tests"
    )
    recorded = read_manifest(out)["suite"]["tasks"]
    assert recorded["02-duration-millisecond-units"]["problem"].startswith("no hidden tests")


def test_an_external_endpoint_gets_the_task_sanitized_or_not_at_all(
    coder_gateway: Gateway, tmp_path: Path
) -> None:
    # Task 08's instruction names a host under example.internal.
    out = tmp_path / "external"
    result = run_eval(
        coder_gateway, out, "--external", "--outbound", "block", "--internal-domain",
        "example.internal", "--task", "08-config-env-defaults", "--task",
        "01-token-bucket-refill", models=("coder-large",),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    reasons = {a.task: a.reason for a in read_attempts(out)}
    assert reasons == {"08-config-env-defaults": "blocked: the task holds host",
                       "01-token-bucket-refill": None}  # fmt: skip
    manifest = read_manifest(out)
    assert manifest["outbound"] == {"applied_by": "gateway eval", "policy": "block",
                                    "internal_domains": ["example.internal"]}  # fmt: skip


def test_the_report_of_a_run_states_its_policy_scores_and_charts(finished_run: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "eval", "report", str(finished_run)],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = finished_run / "report"
    text = (report / "report.md").read_text()
    assert "applied by the gateway" in text
    assert "| coder-large | 80.0 % | 75.0 % |" in text
    assert "| coder-small | 46.7 % | 25.0 % |" in text
    for profile in ("balanced", "cost-sensitive", "security-sensitive"):
        assert profile in text
    for chart in ("pass_rate_vs_cost.png", "ttft.png", "pass_rate_by_category.png"):
        assert (report / chart).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
