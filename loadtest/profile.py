"""Where a gateway worker's time goes under load: py-spy samples it while wrk drives it.

    .venv/bin/python -m loadtest.profile --seconds 15 --connections 32

Starts the benchmark stack (nginx, redis-server, `gateway serve --workers 1` with
loadtest/bench-config and INFO access logs), runs wrk against it, and samples the
worker with py-spy meanwhile. Prints the share of samples per function (self time,
then inclusive time, grouped by module for the gateway's own code) and keeps the
collapsed stacks (the input of flamegraph tools) in the file it names.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from loadtest.stack import bench_stack, wrk, wrk_script


def _collapsed(pid: int, seconds: int, out: Path, rate: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(pid),
            "--duration", str(seconds), "--rate", str(rate), "--format", "raw",
            "--output", str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip


def _frame_name(frame: str) -> str:
    # py-spy raw frames look like "function (path/to/module.py:123)".
    name, _, where = frame.partition(" (")
    path = where.split(":")[0]
    for marker in ("site-packages/", "/gateway/", "/lib/python3.11/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{path}:{name}"


def summarize(collapsed: Path, top: int) -> str:
    """Self and inclusive shares of the samples in a py-spy raw (collapsed) file."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        count = int(count_text)
        frames = [_frame_name(f) for f in stack.split(";") if f]
        total += count
        if frames:
            own[frames[-1]] += count
        for name in set(frames):
            inclusive[name] += count
    lines = [f"{total} samples", "", "self %   function"]
    lines += [f"{100 * n / total:6.1f}   {name}" for name, n in own.most_common(top)]
    lines += ["", "incl %   function"]
    lines += [f"{100 * n / total:6.1f}   {name}" for name, n in inclusive.most_common(top)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()

    out = Path(tempfile.mkdtemp(prefix="profile-")) / "gateway.collapsed"
    with bench_stack(workers=1, log_level="INFO") as stack:
        script = wrk_script()
        wrk(stack.chat_url, args.connections, 2, script)  # warm up
        sampler = _collapsed(stack.gateway_pid, args.seconds, out, args.rate)
        result = wrk(stack.chat_url, args.connections, args.seconds, script)
        sampler.wait()
    print(
        f"wrk c{args.connections}: {result['rps']:.0f} req/s, p50 {result['p50']:.2f} ms "
        f"(under py-spy at {args.rate} Hz)\n"
    )
    print(summarize(out, args.top))
    print(f"\ncollapsed stacks: {out}")


if __name__ == "__main__":
    main()
