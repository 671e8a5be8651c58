"""Exemplars across worker processes (gateway/observability/exemplars.py): each worker's
newest per bucket in its file, the newest of all on the bucket's sample; the whole
multi-worker exposition is checked end to end in tests/e2e/test_tracing.py."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.core import HistogramMetricFamily

from gateway.observability.exemplars import (
    WorkerExemplars,
    attached,
    bucket_bound,
    clear,
    forget,
)

BOUNDS = (0.1, 0.5, 1.0, float("inf"))


def family() -> HistogramMetricFamily:
    histogram = HistogramMetricFamily("latency_seconds", "", labels=["model"])
    histogram.add_metric(["llm"], [("0.1", 1), ("0.5", 2), ("1.0", 3), ("+Inf", 4)], 2.0)
    return histogram


def exemplars_of(tmp_path: Path) -> dict[str, str]:
    (shown,) = attached([family()], str(tmp_path))
    return {s.labels["le"]: s.exemplar.labels["trace_id"] for s in shown.samples if s.exemplar}


def test_a_value_goes_to_the_smallest_bucket_that_holds_it() -> None:
    assert [bucket_bound(v, BOUNDS) for v in (0.05, 0.1, 0.3, 7.0)] == ["0.1", "0.1", "0.5", "+Inf"]


def test_each_bucket_shows_the_newest_exemplar_of_any_worker(tmp_path: Path) -> None:
    first, second = WorkerExemplars(str(tmp_path), 101), WorkerExemplars(str(tmp_path), 102)
    first.note("latency_seconds", {"model": "llm"}, BOUNDS, 0.3, "a" * 32)
    second.note("latency_seconds", {"model": "llm"}, BOUNDS, 0.4, "b" * 32)
    first.note("latency_seconds", {"model": "llm"}, BOUNDS, 5.0, "c" * 32)
    first.note("latency_seconds", {"model": "other"}, BOUNDS, 0.05, "d" * 32)
    first.write()
    second.write()
    assert exemplars_of(tmp_path) == {"0.5": "b" * 32, "+Inf": "c" * 32}


def test_an_exited_worker_s_exemplars_go_with_it(tmp_path: Path) -> None:
    worker = WorkerExemplars(str(tmp_path), 103)
    worker.note("latency_seconds", {"model": "llm"}, BOUNDS, 0.3, "a" * 32)
    worker.write()
    forget(str(tmp_path), [103])
    assert exemplars_of(tmp_path) == {}
    worker.write()
    clear(str(tmp_path))
    assert exemplars_of(tmp_path) == {}


def test_a_torn_or_foreign_file_is_skipped(tmp_path: Path) -> None:
    (tmp_path / "exemplars_104.json").write_text('{"half')
    worker = WorkerExemplars(str(tmp_path), 105)
    worker.note("latency_seconds", {"model": "llm"}, BOUNDS, 0.3, "e" * 32)
    worker.write()
    assert exemplars_of(tmp_path) == {"0.5": "e" * 32}
