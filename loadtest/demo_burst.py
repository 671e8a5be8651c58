"""The demo's closed loop, seen: 32 streams on `llm-small` for 60 s, then 90 s of quiet,
with `gateway_model_replicas` (desired and ready) and the outcomes printed every 5 s.

    ./scripts/demo.sh &    # then, once it prints its examples:
    .venv/bin/python -m loadtest.demo_burst [--url http://127.0.0.1:8080] [--ops http://127.0.0.1:8081]

Streams use acme's key (600 requests a minute): what the limit refuses gets a 429 with
`Retry-After`, is waited out and counted; what the loop scales on is what is admitted.
"""

from __future__ import annotations

import argparse
import collections
import re
import threading
import time
import urllib.request

from openai import APIStatusError, OpenAI

STREAMS, BURST_S, TOTAL_S, EVERY_S = 32, 60.0, 150.0, 5.0
REPLICAS = re.compile(r'gateway_model_replicas\{model="([^"]+)",state="(\w+)"\} ([\d.]+)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--ops", default="http://127.0.0.1:8081")
    args = parser.parse_args()
    client = OpenAI(base_url=f"{args.url}/v1", api_key="sk-acme-demo", max_retries=0)
    outcomes: collections.Counter[str] = collections.Counter()
    started = time.monotonic()

    def stream() -> None:
        while time.monotonic() - started < BURST_S:
            try:
                chunks = client.chat.completions.create(
                    model="llm-small", messages=[{"role": "user", "content": "Tell me a story"}],
                    max_tokens=200, stream=True,
                )  # fmt: skip
                for _ in chunks:
                    pass
                outcomes["ok"] += 1
            except APIStatusError as exc:
                wait = exc.response.headers.get("retry-after")
                outcomes[f"{exc.status_code} (Retry-After: {wait})"] += 1
                time.sleep(float(wait or 1))
            except Exception as exc:  # a lost stream is counted, never hidden
                outcomes[type(exc).__name__] += 1

    workers = [threading.Thread(target=stream) for _ in range(STREAMS)]
    for worker in workers:
        worker.start()
    while (elapsed := time.monotonic() - started) < TOTAL_S:
        body = urllib.request.urlopen(f"{args.ops}/metrics", timeout=5).read().decode()
        counts = {(m, s): int(float(v)) for m, s, v in REPLICAS.findall(body)}
        print(
            f"{elapsed:5.0f} s  llm-small desired={counts.get(('llm-small', 'desired'))} "
            f"ready={counts.get(('llm-small', 'ready'))}  {dict(outcomes)}",
            flush=True,
        )
        time.sleep(EVERY_S)
    for worker in workers:
        worker.join()


if __name__ == "__main__":
    main()
