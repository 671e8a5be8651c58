"""`gateway usage report` run as a user runs it (`gateway.cli.main`), on the shipped
config: its ledger in the demo's state directory (GATEWAY_STATE_DIR), or where the
config points without one (issue 39)."""

from __future__ import annotations

import asyncio
import re
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.ledger.sqlite_ledger import SqliteLedger
from gateway.ledger.usage_report import MEASURES
from tests.unit.ledger.usage_samples import mcp_call, sample

SHIPPED = Path(__file__).resolve().parents[3] / "config"
STATE_DIR = "GATEWAY_STATE_DIR"
EMPTY = "no usage in this window"
GROUPS = ["tenant", "key", "model"]
HEADER = [*GROUPS, *(m if m != "cost_micros" else "cost_USD" for m in MEASURES)]


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """The shipped gateway.yaml (with its tenants and cluster files), its ledger's
    fallback without a state directory moved from /tmp into the test's own directory."""
    directory = tmp_path / "config"
    directory.mkdir()
    for name in ("tenants.yaml", "cluster.yaml"):
        shutil.copy(SHIPPED / name, directory / name)
    text = (SHIPPED / "gateway.yaml").read_text(encoding="utf-8")
    assert "${GATEWAY_STATE_DIR:-/tmp}/gateway-demo-usage.db" in text
    text = text.replace("${GATEWAY_STATE_DIR:-/tmp}", f"${{GATEWAY_STATE_DIR:-{tmp_path}/tmp}}")
    (directory / "gateway.yaml").write_text(text, encoding="utf-8")
    return directory / "gateway.yaml"


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The demo's state directory, named in the environment (not made)."""
    state = tmp_path / "state"
    monkeypatch.setenv(STATE_DIR, str(state))
    return state


def report(config: Path, *options: str) -> int:
    return main(["usage", "report", "--config", str(config), "--since", "1h", *options])


def write(path: Path, *records_at: float, **fields: object) -> None:
    """A ledger as the gateway writes it: its own store, a record at each time."""

    async def run() -> None:
        store = SqliteLedger(path)
        try:
            await store.write([sample(i, ts=ts, **fields) for i, ts in enumerate(records_at)])
        finally:
            await store.close()

    asyncio.run(run())


def test_a_window_without_usage_prints_the_header_and_says_so(
    config: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(state_dir / "gateway-demo-usage.db", 1_700_000_000.0)  # a record from 2023 only
    assert report(config, "--by", "tenant,key,model") == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].split() == HEADER
    assert lines[1:] == [EMPTY]
    assert err == ""


def test_an_empty_window_as_csv_is_the_header_line_alone(
    config: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(state_dir / "gateway-demo-usage.db")  # the ledger made, no record in it
    assert report(config, "--by", "tenant,key,model", "--csv") == 0
    assert report(config, "--by", "", "--csv") == 0  # totals: no row of zeros either
    out, err = capsys.readouterr()
    assert out.splitlines() == [",".join([*GROUPS, *MEASURES]), ",".join(MEASURES)]
    assert err == ""


def test_totals_of_an_empty_window_say_so(
    config: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(state_dir / "gateway-demo-usage.db")
    assert report(config, "--by", "") == 0
    out, _ = capsys.readouterr()
    assert out.splitlines()[1:] == [EMPTY]


def test_a_window_with_usage_is_reported(
    config: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(state_dir / "gateway-demo-usage.db", time.time() - 60, latency_ms=618.3241809)
    assert report(config, "--by", "tenant,key,model") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == HEADER
    assert lines[1].split()[:4] == ["acme", "k1", "llama-8b", "1"]
    assert lines[1].split()[-2:] == ["618", "618"]  # p50 and p95 in whole milliseconds
    assert EMPTY not in lines


def test_usage_is_reported_by_outcome_with_failed_mcp_calls_as_errors(
    config: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    now = time.time() - 60
    records = [
        mcp_call(i, outcome, ts=now + i, latency_ms=5.0)
        for i, outcome in enumerate(["ok", "tool_error", "timeout", "refused", "timeout"])
    ]
    records.append(sample(9, ts=now + 9, status=429, outcome="rate_requests", latency_ms=5.0))

    async def run() -> None:
        store = SqliteLedger(state_dir / "gateway-demo-usage.db")
        try:
            await store.write(records)
        finally:
            await store.close()

    asyncio.run(run())
    assert report(config, "--by", "endpoint,outcome", "--csv") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ",".join(["endpoint", "outcome", *MEASURES])
    errors = MEASURES.index("errors") + 2
    # endpoint, outcome, requests ... errors: a call that failed answered 200 all the same.
    assert [(*line.split(",")[:3], line.split(",")[errors]) for line in lines[1:]] == [
        ("mcp", "ok", "1", "0"),
        ("mcp", "refused", "1", "1"),
        ("mcp", "timeout", "2", "2"),
        ("mcp", "tool_error", "1", "0"),
        ("responses", "rate_requests", "1", "1"),
    ]


@pytest.mark.parametrize("form", [[], ["--csv"]], ids=["table", "csv"])
def test_a_ledger_that_is_not_there_is_named_and_not_created(
    config: Path, state_dir: Path, form: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert report(config, "--by", "tenant,key,model", *form) == 1
    out, err = capsys.readouterr()
    assert out == ""
    [line] = err.splitlines()
    assert f"no usage ledger at {state_dir / 'gateway-demo-usage.db'}" in line
    assert f"ledger.url, {config}:" in line
    assert f"{STATE_DIR}={state_dir}" in line
    assert not state_dir.exists()  # neither the file nor its directory


def test_without_a_state_directory_the_message_says_it_is_not_set(
    config: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv(STATE_DIR, raising=False)
    (tmp_path / "tmp").mkdir()  # the fallback directory is there, the ledger is not
    assert report(config, "--by", "tenant,key,model") == 1
    [line] = capsys.readouterr().err.splitlines()
    assert f"no usage ledger at {tmp_path / 'tmp' / 'gateway-demo-usage.db'}" in line
    assert f"{STATE_DIR} not set" in line
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_file_that_is_no_ledger_is_refused_untouched(
    config: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state_dir.mkdir()
    (state_dir / "gateway-demo-usage.db").write_bytes(b"")  # an empty file, say
    assert report(config, "--by", "tenant") == 1
    [line] = capsys.readouterr().err.splitlines()
    assert "holds no usage ledger (no usage_ledger table)" in line
    assert [p.name for p in state_dir.iterdir()] == ["gateway-demo-usage.db"]
    assert (state_dir / "gateway-demo-usage.db").read_bytes() == b""


@pytest.fixture
def refusing_port() -> Iterator[int]:
    """A local port held (bound, never listening): a connection to it is refused."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield held.getsockname()[1]


def test_a_postgres_ledger_that_does_not_answer_is_one_line(
    config: Path, refusing_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"postgresql://gateway:s3cret@127.0.0.1:{refusing_port}/usage"
    text = re.sub(r"(?m)^  url: sqlite:.*$", f"  url: {url}", config.read_text(encoding="utf-8"))
    config.write_text(text, encoding="utf-8")
    assert report(config, "--by", "tenant") == 1
    out, err = capsys.readouterr()
    assert out == ""
    [line] = err.splitlines()
    assert line.startswith(
        f"gateway usage report: cannot read the usage ledger in "
        f"postgresql://gateway@127.0.0.1:{refusing_port}/usage: "
    )
    assert "s3cret" not in line
