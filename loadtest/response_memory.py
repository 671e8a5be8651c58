"""How much Redis memory a stored Responses API conversation takes, by its length.

    ./scripts/demo.sh      # then:
    .venv/bin/python -m loadtest.response_memory [--base-url http://127.0.0.1:8080/v1]
        [--key sk-acme-demo] [--tenant acme] [--redis-url redis://127.0.0.1:6379/0]
        [--prefix gw] [--model llm-small]

Runs conversations of 1, 5, 10 and 20 turns through `client.responses` (each turn a
question of about 100 characters, continued by `previous_response_id`), then reads
`MEMORY USAGE` of each turn's stored response, and deletes every response it made.
Prints a Markdown table.
"""

from __future__ import annotations

import argparse

import redis
from openai import OpenAI

QUESTION = "Tell me about the deployment of model number {turn} on the cluster, briefly. "


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    parser.add_argument("--key", default="sk-acme-demo")
    parser.add_argument("--tenant", default="acme")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--prefix", default="gw")
    parser.add_argument("--model", default="llm-small")
    args = parser.parse_args()
    client = OpenAI(base_url=args.base_url, api_key=args.key, max_retries=0)
    store = redis.Redis.from_url(args.redis_url)
    made: list[str] = []
    print("| turns | answer tokens a turn | bytes stored (last turn) | MEMORY USAGE (last turn) "
          "| all turns' responses together |")  # fmt: skip
    print("|---|---|---|---|---|")
    try:
        for turns in (1, 5, 10, 20):
            previous = None
            sizes = []
            for turn in range(turns):
                reply = client.responses.create(
                    model=args.model,
                    input=QUESTION.format(turn=turn),
                    previous_response_id=previous,
                    max_output_tokens=32,
                )
                previous = reply.id
                made.append(reply.id)
                key = f"{args.prefix}:{{{args.tenant}}}:resp:{reply.id}"
                sizes.append((store.strlen(key), store.memory_usage(key) or 0))
            print(
                f"| {turns} | 32 | {sizes[-1][0]:,} | {sizes[-1][1]:,} | "
                f"{sum(m for _, m in sizes):,} |"
            )
    finally:
        for response_id in made:
            client.responses.delete(response_id)


if __name__ == "__main__":
    main()
