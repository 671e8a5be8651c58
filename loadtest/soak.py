"""Does a gateway worker's memory stay flat under sustained load?

    .venv/bin/python -m loadtest.soak --minutes 10 --connections 32

Starts the benchmark stack (nginx, redis-server, `gateway serve --workers 1` with
loadtest/bench-config and INFO access logs) and drives it with wrk in 30-second slices,
alternating plain and streaming chat requests. After each slice it reads the worker's
resident memory (VmRSS). Prints one row per slice, then the growth from the end of the
first minute (warm-up: caches, pools and the allocator's arenas fill) to the end.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from loadtest.stack import STREAM_BODY, bench_stack, wrk, wrk_script

SLICE_S = 30


def rss_mib(pid: int) -> float:
    """Resident memory of process `pid` in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--connections", type=int, default=32)
    args = parser.parse_args()
    slices = max(2, round(args.minutes * 60 / SLICE_S))
    scripts = [wrk_script(), wrk_script(body=STREAM_BODY)]
    rows = []
    with bench_stack(workers=1, log_level="INFO") as stack:
        start_rss = rss_mib(stack.gateway_pid)
        total = 0.0
        for index in range(slices):
            result = wrk(stack.chat_url, args.connections, SLICE_S, scripts[index % 2])
            total += result["requests"]
            rows.append((index, result["rps"], total, rss_mib(stack.gateway_pid)))
    print(f"RSS before load: {start_rss:.1f} MiB\n")
    print("| minute | kind | requests/s | requests so far | RSS MiB |")
    print("|---|---|---|---|---|")
    for index, rps, done, rss in rows:
        minute = (index + 1) * SLICE_S / 60
        kind = "stream" if index % 2 else "chat"
        print(f"| {minute:.1f} | {kind} | {rps:.0f} | {done:.0f} | {rss:.1f} |")
    warm = rows[min(1, len(rows) - 1)]
    last = rows[-1]
    growth = last[3] - warm[3]
    per_million = growth / max(1.0, last[2] - warm[2]) * 1e6
    since, until = (warm[0] + 1) * SLICE_S / 60, (last[0] + 1) * SLICE_S / 60
    print(
        f"\nRSS from minute {since:.1f} to {until:.1f}:"
        f" {warm[3]:.1f} -> {last[3]:.1f} MiB ({growth:+.1f} MiB,"
        f" {per_million:+.2f} MiB per million requests)"
    )


if __name__ == "__main__":
    main()
