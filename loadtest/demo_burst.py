"""The demo's closed loop, seen: 32 streams on `llm-small` for 60 s, then 90 s of quiet,
with `gateway_model_replicas` (desired and ready) and the outcomes printed every 5 s.

    ./scripts/demo.sh &    # then, once it prints its examples:
    .venv/bin/python -m loadtest.demo_burst [--url http://127.0.0.1:8080] [--ops http://127.0.0.1:8081]

Streams use acme's key (600 requests a minute): what the limit refuses gets a 429 with
`Retry-After`, is waited out and counted; what the loop scales on is what is admitted.

A burst that needs a second replica within acme's limits, on any machine: after the
first seconds acme's limit admits 10 requests a second, and each asks for a long story
(prompts the simulated model answers with 56 to 64 tokens, at 8 ms a token: its answer's
length is a hash of the prompt), so about 5 are running at any time: more than one
replica's 4 slots (config/cluster.yaml) can hold at the loop's 75% target. A slower
machine only makes each answer longer.
"""

from __future__ import annotations

import argparse
import collections
import re
import threading
import time
import urllib.request

from openai import APIStatusError, OpenAI

from gateway.inference.prompt import PromptTemplate
from gateway.inference.types import ChatMessage
from gateway_tools.dev.sim.model_template import natural_length

STREAMS, BURST_S, TOTAL_S, EVERY_S = 32, 60.0, 150.0, 5.0
REPLICAS = re.compile(r'gateway_model_replicas\{model="([^"]+)",state="(\w+)"\} ([\d.]+)')
LONG_TOKENS = 56


def long_stories(count: int) -> list[str]:
    """Questions llm-small (chatml, simulated) answers at length: 56 tokens or more."""
    template, found = PromptTemplate("chatml"), []
    for i in range(10_000):
        question = f"Tell me a long story, number {i}"
        prompt = template.render([ChatMessage("user", question)]).encode()
        if natural_length(prompt) >= LONG_TOKENS:
            found.append(question)
            if len(found) == count:
                return found
    raise RuntimeError("no prompt with a long answer")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--ops", default="http://127.0.0.1:8081")
    args = parser.parse_args()
    client = OpenAI(base_url=f"{args.url}/v1", api_key="sk-acme-demo", max_retries=0)
    outcomes: collections.Counter[str] = collections.Counter()
    questions = long_stories(STREAMS)
    started = time.monotonic()

    def stream(question: str) -> None:
        while time.monotonic() - started < BURST_S:
            try:
                chunks = client.chat.completions.create(
                    model="llm-small", messages=[{"role": "user", "content": question}],
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

    workers = [threading.Thread(target=stream, args=(q,)) for q in questions]
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
