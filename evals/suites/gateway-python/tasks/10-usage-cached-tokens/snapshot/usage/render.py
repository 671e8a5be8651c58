"""Usage as the gateway reports it to clients, in the OpenAI shape."""

from __future__ import annotations

from usage.model import Usage


def usage_to_openai(usage: Usage) -> dict[str, object]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }
