"""The three APIs side by side: chat completions, Anthropic Messages, the Responses API.

    .venv/bin/python -m loadtest.bench_wires [--seconds 10] [--rounds 1]

One gateway (`--workers 1`, loadtest/bench-config: limits, admission, metrics on) in front
of the instant nginx upstream (a fixed chat answer, and a fixed 20-chunk stream on the
next port), measured with wrk at concurrency 1 and 32, non-streamed and streamed, the
targets interleaved in each round. The same model and upstream serve all three, so the
difference is each API's translation (and, for `store: true`, keeping the response in
Redis). Prints a Markdown table of medians.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics

from loadtest.stack import bench_stack, interleaved, wrk_script

HELLO = [{"role": "user", "content": "Hello"}]


def bodies(stream: bool) -> dict[str, str]:
    model = "fake-llama-8b-stream" if stream else "fake-llama-8b"
    extra = {"stream": True} if stream else {}
    return {
        "/v1/chat/completions": json.dumps(
            {"model": model, "messages": HELLO, "max_tokens": 16, **extra}
        ),
        "/v1/messages": json.dumps({"model": model, "messages": HELLO, "max_tokens": 16, **extra}),
        "/v1/responses (store: false)": json.dumps(
            {"model": model, "input": "Hello", "max_output_tokens": 16, "store": False, **extra}
        ),
        "/v1/responses (store: true)": json.dumps(
            {"model": model, "input": "Hello", "max_output_tokens": 16, **extra}
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (apt-get install wrk)")
    with bench_stack(1, "WARNING") as stack:
        targets = {
            (name, stream): (f"{stack.gateway_url}{name.split(' ')[0]}", wrk_script(body=body))
            for stream in (False, True)
            for name, body in bodies(stream).items()
        }
        measured = interleaved(stack, targets, args.seconds, args.rounds)
    results = {(name, stream, c): found for ((name, stream), c), found in measured.items()}
    print("| endpoint | streamed | c | requests/s | p50 ms | p99 ms | gateway CPU µs/request |")
    print("|---|---|---|---|---|---|---|")
    for (name, stream, connections), runs in sorted(
        results.items(), key=lambda item: (item[0][1], item[0][2])
    ):
        med = {k: statistics.median(r[k] for r in runs) for k in ("rps", "p50", "p99", "cpu_us")}
        print(
            f"| {name} | {'yes' if stream else 'no'} | {connections} | {med['rps']:,.0f} | "
            f"{med['p50']:.2f} | {med['p99']:.2f} | {med['cpu_us']:,.0f} |"
        )


if __name__ == "__main__":
    main()
