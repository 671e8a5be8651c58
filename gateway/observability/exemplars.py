"""Histogram exemplars across worker processes.

prometheus-client keeps exemplars in a single process only: its multiprocess mode,
which `gateway serve --workers N` and the Kubernetes base run, drops them
(client_python#826). So each worker keeps the newest exemplar of every bucket it has
observed a traced request in, and writes them to `exemplars_<pid>.json` in the metrics
directory, at most once a second (a timer writes the last ones); the worker answering a
scrape puts each bucket's newest of all workers on that bucket's sample.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence

from prometheus_client.core import Metric
from prometheus_client.samples import Exemplar, Sample
from prometheus_client.utils import floatToGoString

# How often a worker writes its exemplars at most.
WRITE_EVERY_S = 1.0
_PATTERN = "exemplars_*.json"

# A bucket: (histogram, its labels but `le` in order, `le`).
Key = tuple[str, tuple[tuple[str, str], ...], str]


def bucket_bound(value: float, bounds: Sequence[float]) -> str:
    """The `le` of the bucket `value` falls in (bounds ascending, +Inf last)."""
    for bound in bounds:
        if value <= bound:
            return str(floatToGoString(bound))  # type: ignore[no-untyped-call]
    return "+Inf"


class WorkerExemplars:
    """This worker's newest exemplar of each bucket, and its file."""

    def __init__(self, directory: str, pid: int | None = None) -> None:
        self.path = os.path.join(directory, f"exemplars_{pid or os.getpid()}.json")
        # Key as JSON text -> [trace id, value, timestamp].
        self._newest: dict[str, list[object]] = {}
        self._written = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def note(
        self,
        name: str,
        labels: Mapping[str, str],
        bounds: Sequence[float],
        value: float,
        trace_id: str,
    ) -> None:
        """A traced request's `value` observed in histogram `name` with `labels`."""
        key: Key = (name, tuple(sorted(labels.items())), bucket_bound(value, bounds))
        self._newest[json.dumps(key)] = [trace_id, value, time.time()]
        now = time.monotonic()
        if now - self._written >= WRITE_EVERY_S:
            self.write()
        elif self._timer is None:
            with contextlib.suppress(RuntimeError):  # no loop: the next note writes
                loop = asyncio.get_running_loop()
                self._timer = loop.call_later(WRITE_EVERY_S, self.write)

    def write(self) -> None:
        """Write the exemplars to this worker's file (whole: a reader never sees half)."""
        self._written = time.monotonic()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        staged = self.path + ".tmp"
        with open(staged, "w", encoding="utf-8") as file:
            json.dump(self._newest, file)
        os.replace(staged, self.path)


def attached(families: Iterable[Metric], directory: str) -> Iterator[Metric]:
    """`families` with each histogram bucket's newest exemplar of every worker's file."""
    newest = _read_all(directory)
    for family in families:
        if family.type == "histogram" and newest:
            family.samples = [_with_exemplar(family.name, s, newest) for s in family.samples]
        yield family


def _with_exemplar(name: str, sample: Sample, newest: Mapping[Key, list[object]]) -> Sample:
    if not sample.name.endswith("_bucket"):
        return sample
    labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le"))
    found = newest.get((name, labels, sample.labels.get("le", "")))
    if found is None:
        return sample
    trace_id, value, timestamp = found
    exemplar = Exemplar({"trace_id": str(trace_id)}, float(value), float(timestamp))  # type: ignore[arg-type]
    return sample._replace(exemplar=exemplar)


def _read_all(directory: str) -> dict[Key, list[object]]:
    newest: dict[Key, list[object]] = {}
    for path in glob.glob(os.path.join(glob.escape(directory), _PATTERN)):
        try:
            with open(path, encoding="utf-8") as file:
                written: dict[str, list[object]] = json.load(file)
        except (OSError, ValueError):
            continue  # gone meanwhile (a dead worker's), or not whole
        for text, exemplar in written.items():
            name, labels, le = json.loads(text)
            key: Key = (name, tuple((k, v) for k, v in labels), le)
            if key not in newest or float(exemplar[2]) > float(newest[key][2]):  # type: ignore[arg-type]
                newest[key] = exemplar
    return newest


def forget(directory: str, pids: Iterable[int]) -> None:
    """Remove the files of workers that have exited."""
    for pid in pids:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(directory, f"exemplars_{pid}.json"))


def clear(directory: str) -> None:
    """Remove every worker's file (an earlier run's, at start)."""
    for path in glob.glob(os.path.join(glob.escape(directory), _PATTERN)):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
