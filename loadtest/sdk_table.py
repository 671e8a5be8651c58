"""Issue 13's table, re-run with the official `openai` SDK against a running gateway
(the demo's models: `./scripts/demo.sh`, then this).

    .venv/bin/python -m loadtest.sdk_table [--base-url http://127.0.0.1:8080/v1]
        [--key sk-acme-demo]

Each row is one call as a client writes it; the table says what came back.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from openai import OpenAI, OpenAIError
from pydantic import BaseModel

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


class City(BaseModel):
    name: str
    population: int


def rows(client: OpenAI) -> list[tuple[str, Callable[[], str]]]:
    def tools() -> str:
        reply = client.chat.completions.create(model="llm-large", messages=ASK, tools=[WEATHER])
        (call,) = reply.choices[0].message.tool_calls or []
        return f"{reply.choices[0].finish_reason}: {call.function.name}({call.function.arguments})"

    def tools_streamed() -> str:
        chunks = list(
            client.chat.completions.create(
                model="llm-small", messages=ASK, tools=[WEATHER], stream=True
            )
        )
        pieces = [c for c in chunks if c.choices and c.choices[0].delta.tool_calls]
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        return f"{len(pieces)} `delta.tool_calls` chunks, finish {finish}"

    def json_object() -> str:
        reply = client.chat.completions.create(
            model="llm-small", messages=ASK, response_format={"type": "json_object"}
        )
        return f"JSON: {reply.choices[0].message.content}"

    def parse() -> str:
        reply = client.chat.completions.parse(model="llm-large", messages=ASK, response_format=City)
        return f"parsed: {reply.choices[0].message.parsed!r}"

    def n() -> str:
        reply = client.chat.completions.create(
            model="llm-small", messages=ASK, n=2, seed=1, max_tokens=6
        )
        return " / ".join(f"{c.index}: {c.message.content!r}" for c in reply.choices)

    def logprobs() -> str:
        reply = client.chat.completions.create(
            model="llm-small", messages=ASK, logprobs=True, max_tokens=3
        )
        content = reply.choices[0].logprobs.content or []  # type: ignore[union-attr]
        return ", ".join(f"{e.token!r} {e.logprob:.3f}" for e in content)

    def top_logprobs() -> str:
        client.chat.completions.create(
            model="llm-small", messages=ASK, logprobs=True, top_logprobs=2, max_tokens=3
        )
        return "answered"

    def prompts() -> str:
        reply = client.completions.create(
            model="llm-small", prompt=["Once upon", "In a galaxy"], max_tokens=4
        )
        return " / ".join(f"{c.index}: {c.text!r}" for c in reply.choices)

    def embeddings() -> str:
        reply = client.embeddings.create(model="embed-small", input=["a cat", "a dog"])
        base64 = client.embeddings.create(
            model="embed-small", input="a cat", encoding_format="base64"
        )
        lengths = [len(item.embedding) for item in reply.data]
        return (
            f"{len(reply.data)} vectors of {lengths[0]} (the SDK's default, base64, decoded); "
            f"base64 asked: {len(base64.data[0].embedding)} characters; usage "
            f"{reply.usage.prompt_tokens} tokens"
        )

    def retrieve() -> str:
        return repr(client.models.retrieve("llm-small"))

    return [
        ("`tools=[...]`, not streamed", tools),
        ("`tools=[...]`, streamed", tools_streamed),
        ('`response_format={"type": "json_object"}`', json_object),
        ("`client.chat.completions.parse(response_format=City)`", parse),
        ("`n=2`", n),
        ("`logprobs=True`", logprobs),
        ("`logprobs=True, top_logprobs=2` (a Triton model)", top_logprobs),
        ("`/v1/completions` with a list of prompts", prompts),
        ("`client.embeddings.create(...)`", embeddings),
        ('`client.models.retrieve("llm-small")`', retrieve),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    parser.add_argument("--key", default="sk-acme-demo")
    args = parser.parse_args()
    client = OpenAI(base_url=args.base_url, api_key=args.key, max_retries=0)
    print("| request | now |")
    print("|---|---|")
    for name, call in rows(client):
        try:
            result = call()
        except OpenAIError as exc:
            result = f"{type(exc).__name__}: {exc}"
        print(f"| {name} | {result.replace('|', '/')} |")


if __name__ == "__main__":
    main()
