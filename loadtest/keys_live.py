"""Managed keys and budgets on a running gateway, as an operator and a client see them.

    ./scripts/demo.sh &                       # the demo: admin key sk-ops-demo
    .venv/bin/python -m loadtest.keys_live [--url http://127.0.0.1:8080]
        [--ops-url http://127.0.0.1:8081] [--tenant acme] [--streams 60]

Two runs, each on a key of its own made through `POST /admin/keys`:

1. **Spend until refused.** A key with a budget of `--budget` a day (default 0.001 in
   the price table's currency) on `--model`: the openai SDK (no retries) asks until the
   gateway refuses with `insufficient_quota`. Prints the requests answered, the refusal's
   headers, what `/admin/usage` says the key spent, and what its budget in Redis has left
   (with `--redis`).
2. **Revoke under load.** `--streams` streams at once on a second key; once every one has
   its first chunk, the key is revoked (`DELETE /admin/keys/{id}`). Prints how many
   streams ran to their end (finish_reason) and what a new request gets 1 s after the
   revoke (401 expected). The tenant's `max_concurrent` caps the streams it may run at
   once: more than that are refused (429) before the revoke, as without one.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import httpx
import openai

DEMO_ADMIN_KEY = "sk-ops-demo"


async def _make_key(admin: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    made = await admin.post("/admin/keys", json=body)
    made.raise_for_status()
    record: dict[str, Any] = made.json()
    return record


async def spend_until_refused(args: argparse.Namespace, admin: httpx.AsyncClient) -> dict[str, Any]:
    """Run 1: the SDK spends a small budget until refused."""
    record = await _make_key(
        admin,
        {
            "tenant": args.tenant,
            "name": "keys-live-budget",
            "models": [args.model],
            "budget": {"amount": args.budget, "period": "day"},
        },
    )
    client = openai.AsyncOpenAI(base_url=f"{args.url}/v1", api_key=record["key"], max_retries=0)
    answered = 0
    refusal: dict[str, Any] = {}
    while answered < 10_000:
        try:
            await client.chat.completions.create(
                model=args.model,
                messages=[{"role": "user", "content": f"Say something {answered}"}],
                max_tokens=args.max_tokens,
            )
        except openai.RateLimitError as refused:
            headers = refused.response.headers
            refusal = {
                "status": refused.status_code,
                "code": refused.code,
                "retry-after": headers.get("retry-after"),
                "x-should-retry": headers.get("x-should-retry"),
                "x-budget-limit": headers.get("x-budget-limit"),
                "x-budget-remaining": headers.get("x-budget-remaining"),
            }
            break
        answered += 1
    await client.close()
    # The ledger writes off the request path, in batches: give it a moment.
    await asyncio.sleep(2.5)
    usage = await admin.get("/admin/usage", params={"by": "key", "since": "1h"})
    rows = [r for r in usage.json()["rows"] if r.get("key") == record["id"]]
    result = {"key_id": record["id"], "answered": answered, "refusal": refusal, "ledger": rows}
    if args.redis:
        import redis.asyncio as aioredis

        redis = aioredis.Redis.from_url(args.redis)
        state = await redis.get(f"{args.prefix}:{{{args.tenant}}}:spend:key:{record['id']}:day")
        await redis.aclose()
        result["redis_left_micros"] = None if state is None else float(state.split()[0])
        result["budget_micros"] = round(args.budget * 1_000_000)
    return result


async def revoke_under_load(args: argparse.Namespace, admin: httpx.AsyncClient) -> dict[str, Any]:
    """Run 2: streams on a key that is revoked while they run."""
    record = await _make_key(admin, {"tenant": args.tenant, "name": "keys-live-revoke"})
    client = openai.AsyncOpenAI(
        base_url=f"{args.url}/v1",
        api_key=record["key"],
        max_retries=0,
        http_client=httpx.AsyncClient(limits=httpx.Limits(max_connections=args.streams + 8)),
    )
    started = asyncio.Event()
    first_chunks = 0
    outcomes: list[str] = []

    async def one_stream() -> None:
        nonlocal first_chunks
        finish = None
        seen_first = False
        try:
            stream = await client.chat.completions.create(
                model=args.model,
                messages=[{"role": "user", "content": "Tell a long story"}],
                max_tokens=args.stream_tokens,
                stream=True,
            )
            async for chunk in stream:
                if not seen_first:
                    seen_first = True
                    first_chunks += 1
                    if first_chunks == args.streams:
                        started.set()
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
            outcomes.append(f"finished:{finish}" if finish else "cut")
        except openai.APIStatusError as exc:
            outcomes.append(f"refused:{exc.status_code}")
        except Exception as exc:  # counted, not raised: this is a measure
            outcomes.append(f"failed:{type(exc).__name__}")
        if not seen_first:
            first_chunks += 1  # refused before it started: it will not start later
            if first_chunks == args.streams:
                started.set()

    tasks = [asyncio.create_task(one_stream()) for _ in range(args.streams)]
    await asyncio.wait_for(started.wait(), timeout=60)
    revoked_at = time.monotonic()
    revoke = await admin.delete(f"/admin/keys/{record['id']}")
    await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - revoked_at)))
    try:
        await client.models.list()
        after = "200"
    except openai.APIStatusError as exc:
        after = str(exc.status_code)
    await asyncio.gather(*tasks)
    await client.close()
    counts: dict[str, int] = {}
    for outcome in outcomes:
        counts[outcome] = counts.get(outcome, 0) + 1
    return {"revoke_status": revoke.status_code, "streams": counts, "new_request_1s_after": after}


async def run(args: argparse.Namespace) -> None:
    headers = {"authorization": f"Bearer {args.admin_key}"}
    async with httpx.AsyncClient(base_url=args.ops_url, headers=headers, timeout=30) as admin:
        print("spend until refused:", await spend_until_refused(args, admin))
        print("revoke under load:", await revoke_under_load(args, admin))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--ops-url", default="http://127.0.0.1:8081")
    parser.add_argument("--admin-key", default=DEMO_ADMIN_KEY)
    parser.add_argument("--tenant", default="acme")
    parser.add_argument("--model", default="llm-small")
    parser.add_argument("--budget", type=float, default=0.001)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--streams", type=int, default=60)
    parser.add_argument("--stream-tokens", type=int, default=64)
    parser.add_argument("--redis", help="the gateway's Redis URL, to read the budget's level")
    parser.add_argument("--prefix", default="gw", help="the gateway's redis.key_prefix")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
