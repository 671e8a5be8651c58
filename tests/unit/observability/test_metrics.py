"""/metrics with several worker processes (prometheus-client multiprocess mode).

Two real processes write into one PROMETHEUS_MULTIPROC_DIR; one exits; the survivor's
exposition has the sums and nothing left of the dead one's gauges.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.observability import metrics

ROOT = Path(__file__).resolve().parents[3]

# A worker: sets its metrics from argv[1], prints "ready", then answers "render"
# (the exposition, then "--end--") and "exit" on stdin.
WORKER = r"""
import json, sys
from types import SimpleNamespace
from gateway.observability import metrics
from gateway.serving.gateway_state import GatewayState
from gateway.upstream.outlier import ReplicaState

spec = json.loads(sys.argv[1])
metrics.RATELIMIT_BACKEND_UP.set(spec["redis_up"])
metrics.set_config_version(spec["version"])
metrics.REQUESTS.labels("t", "m", "m", "200", "chat").inc(spec["requests"])
snapshot = SimpleNamespace(in_flight=spec["in_flight"], queued=spec["queued"])
admission = SimpleNamespace(snapshot=lambda model: snapshot)
replicas = [
    SimpleNamespace(url=url, healthy=healthy, metrics_url=url + "/metrics",
                    upstream_pending=pending, upstream_queue_seconds=queue_s,
                    outstanding=outstanding)
    for url, healthy, ejected, pending, queue_s, outstanding in spec["replicas"]
]
ejected = {r[0] for r in spec["replicas"] if r[2]}
outlier = SimpleNamespace(
    state=lambda r: ReplicaState.EJECTED if r.url in ejected else ReplicaState.IN_SERVICE
)
route = SimpleNamespace(
    name="m", pool=SimpleNamespace(replicas=replicas),
    resilience=SimpleNamespace(outlier=outlier),
)
metrics.watch_state(GatewayState(admission, [route]))
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "render":
        sys.stdout.write(metrics.render().decode() + "--end--\n")
        sys.stdout.flush()
    else:
        break
"""


class Worker:
    def __init__(self, directory: Path, **spec: Any) -> None:
        env = {**os.environ, metrics.MULTIPROCESS_DIR_ENV: str(directory)}
        self.process = subprocess.Popen(
            [sys.executable, "-c", WORKER, json.dumps(spec)],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._line() == "ready"

    def _line(self) -> str:
        assert self.process.stdout is not None
        return self.process.stdout.readline().strip()

    def render(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """The exposition, as {(sample name, sorted labels): value}; types in `.types`."""
        assert self.process.stdin is not None
        self.process.stdin.write("render\n")
        self.process.stdin.flush()
        lines = []
        while (line := self._line()) != "--end--":
            assert line or self.process.poll() is None, "worker died"
            lines.append(line)
        families = list(text_string_to_metric_families("\n".join(lines) + "\n"))
        self.types = {f.name: f.type for f in families}
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for f in families
            for s in f.samples
            if not s.name.endswith("_created")
        }

    def exit(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            self.process.wait(timeout=30)
        if self.process.stdout is not None:
            self.process.stdout.close()


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[tuple[Worker, Worker]]:
    r1, r2 = "http://r1:8000", "http://r2:8000"
    old = Worker(
        tmp_path,
        redis_up=0,
        version="v1",
        requests=3,
        in_flight=2,
        queued={"online": 3, "batch": 0},
        # url, healthy, ejected, Triton pending, Triton queue seconds, in flight
        replicas=[[r1, False, True, 5, 10.0, 2], [r2, True, False, 1, 1.0, 0]],
    )
    new = Worker(
        tmp_path,
        redis_up=1,
        version="v2",
        requests=5,
        in_flight=4,
        queued={"online": 1, "batch": 0},
        replicas=[[r1, True, False, 7, 12.5, 3]],
    )
    try:
        yield old, new
    finally:
        old.exit()
        new.exit()


def _labels(**labels: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def test_workers_add_up_and_a_dead_worker_leaves_no_gauge(
    workers: tuple[Worker, Worker], tmp_path: Path
) -> None:
    old, new = workers
    r1 = _labels(model="m", replica="http://r1:8000")
    r2 = _labels(model="m", replica="http://r2:8000")
    requests = (
        "gateway_requests_total",
        _labels(tenant="t", model="m", served_model="m", status="200", endpoint="chat"),
    )

    both = new.render()
    assert both[requests] == 8
    assert both[("gateway_admission_in_flight", _labels(model="m"))] == 6  # livesum
    assert both[("gateway_admission_queued", _labels(model="m", priority="online"))] == 4
    assert both[("gateway_ratelimit_redis_up", ())] == 0  # livemin: one worker without Redis
    assert both[("gateway_config_info", _labels(version="v1"))] == 1  # livemax
    assert both[("gateway_config_info", _labels(version="v2"))] == 1
    assert both[("gateway_replica_healthy", r1)] == 1  # livemax: some worker reaches it
    assert both[("gateway_replica_ejected", r1)] == 1  # livemax: ejected by one worker
    assert both[("gateway_triton_pending_requests", r1)] == 7
    assert both[("gateway_replica_in_flight", r1)] == 5  # livesum: each worker's own
    assert both[("gateway_triton_queue_duration_seconds_total", r1)] == 12.5
    assert new.types["gateway_triton_queue_duration_seconds"] == "counter"
    # r2 is not among the replicas the answering worker serves (a placement moved it):
    # no state series for it (its ejection counter stays).
    assert {name for name, labels in both if labels == r2} == {"gateway_replica_ejections_total"}

    old_pid = old.process.pid
    assert list(tmp_path.glob(f"gauge_live*_{old_pid}.db"))
    old.exit()
    after = new.render()
    assert after[requests] == 8  # the dead worker's counts stay
    assert after[("gateway_admission_in_flight", _labels(model="m"))] == 4
    assert after[("gateway_admission_queued", _labels(model="m", priority="online"))] == 1
    assert after[("gateway_ratelimit_redis_up", ())] == 1
    assert ("gateway_config_info", _labels(version="v1")) not in after
    assert after[("gateway_config_info", _labels(version="v2"))] == 1
    assert after[("gateway_replica_ejected", r1)] == 0
    # mark_process_dead removed the dead worker's gauge files, not its counts.
    assert not list(tmp_path.glob(f"gauge_live*_{old_pid}.db"))
    assert (tmp_path / f"counter_{old_pid}.db").exists()


def test_clear_multiprocess_dir_removes_only_db_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "metrics"
    directory.mkdir()
    own = f"gauge_livemin_{os.getpid()}.db"
    for name in ("counter_1.db", "gauge_livesum_2.db", own, "notes.txt"):
        (directory / name).write_text("")
    monkeypatch.setenv(metrics.MULTIPROCESS_DIR_ENV, str(directory))
    # One worker: this process serves, its files stay.
    metrics.clear_multiprocess_dir(keep_own=True)
    assert sorted(p.name for p in directory.iterdir()) == [own, "notes.txt"]
    # Several: this process only supervises.
    metrics.clear_multiprocess_dir(keep_own=False)
    assert sorted(p.name for p in directory.iterdir()) == ["notes.txt"]
    monkeypatch.setenv(metrics.MULTIPROCESS_DIR_ENV, str(tmp_path / "new"))
    metrics.clear_multiprocess_dir(keep_own=False)
    assert (tmp_path / "new").is_dir()
