"""Ask an OpenAI-compatible endpoint for an answer, streamed, and time it.

One `ask` sends the messages with `stream: true` (the chat API, or the Responses API),
records the time to the first token and to the end, the usage the endpoint reports,
and every status on the way. A 429, a 5xx or a lost connection is retried with
the gateway's own exponential backoff with full jitter (`gateway.upstream.backoff`),
waiting at least what `Retry-After` asks; each retry is
counted, so that rate limits and overload show as stability, not as silence.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from gateway.backends.http import sse_payloads
from gateway.upstream.backoff import Backoff
from gateway_tools.eval.records import Requests

APIS = ("chat", "responses")
_RETRIED = frozenset({429, 500, 502, 503, 504})


@dataclass(frozen=True, slots=True)
class Sampling:
    """The sampling settings of a run (in the manifest: runs compare only under the same)."""

    temperature: float = 0.0
    max_tokens: int = 2048
    seed: int = 1  # attempt i is asked with seed + i


@dataclass(slots=True)
class Reply:
    """What the endpoint answered, and how."""

    text: str = ""
    ok: bool = False
    error: str | None = None
    ttft_s: float | None = None
    total_s: float = 0.0
    tokens_in: int = 0
    tokens_out: int = 0
    requests: Requests = field(default_factory=Requests)
    fallback: str | None = None


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where to ask, and how."""

    base_url: str  # up to and with /v1
    key: str
    api: str = "chat"
    max_retries: int = 4
    timeout_s: float = 300.0
    backoff: Backoff = field(default_factory=lambda: Backoff(base_s=0.5, cap_s=30.0))


async def ask(
    session: aiohttp.ClientSession,
    endpoint: Endpoint,
    model: str,
    messages: list[dict[str, str]],
    sampling: Sampling,
    seed: int,
) -> Reply:
    """Ask `model` for an answer to `messages`, retrying what is worth retrying."""
    reply = Reply()
    url, body = _request(endpoint, model, messages, sampling, seed)
    headers = {"Authorization": f"Bearer {endpoint.key}"}
    started = time.monotonic()
    for attempt in range(endpoint.max_retries + 1):
        reply.requests.sent += 1
        reply.requests.retries = attempt
        wait = await _one(session, endpoint, url, body, headers, reply, started)
        if wait is None:
            break
        if attempt == endpoint.max_retries:
            break
        await asyncio.sleep(max(wait, endpoint.backoff.delay(attempt)))
    reply.total_s = time.monotonic() - started
    return reply


async def _one(
    session: aiohttp.ClientSession,
    endpoint: Endpoint,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    reply: Reply,
    started: float,
) -> float | None:
    """One request: None when done (answered, or failed for good), else seconds to wait."""
    reply.text, reply.ttft_s, reply.error = "", None, None
    timeout = aiohttp.ClientTimeout(total=endpoint.timeout_s)
    try:
        async with session.post(url, json=body, headers=headers, timeout=timeout) as response:
            reply.fallback = response.headers.get("x-gateway-fallback") or reply.fallback
            if response.status != 200:
                return _refused(response.status, await response.text(), response.headers, reply)
            async for event in _events(response):
                _take(event, endpoint.api, reply, started)
            reply.ok = reply.error is None
            return None
    except (TimeoutError, aiohttp.ClientError) as exc:
        reply.requests.connection_errors += 1
        reply.error = f"connection: {type(exc).__name__}: {exc}"[:300]
        return 0.0


def _refused(status: int, text: str, headers: Any, reply: Reply) -> float | None:
    if status == 429:
        reply.requests.status_429 += 1
    if status == 503:
        reply.requests.status_503 += 1
    if status >= 500:
        reply.requests.status_5xx += 1
    try:
        message = json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = text[:200]
    reply.error = f"{status}: {message}"
    if status not in _RETRIED:
        return None
    try:
        return float(headers.get("Retry-After", 0))
    except ValueError:
        return 0.0


def _request(
    endpoint: Endpoint, model: str, messages: list[dict[str, str]], sampling: Sampling, seed: int
) -> tuple[str, dict[str, Any]]:
    base = endpoint.base_url.rstrip("/")
    if endpoint.api == "responses":
        system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
        turns = [m for m in messages if m["role"] != "system"]
        return f"{base}/responses", {
            "model": model, "instructions": system, "input": turns, "stream": True,
            "store": False, "temperature": sampling.temperature,
            "max_output_tokens": sampling.max_tokens,
        }  # fmt: skip
    return f"{base}/chat/completions", {
        "model": model, "messages": messages, "stream": True,
        "stream_options": {"include_usage": True}, "temperature": sampling.temperature,
        "max_tokens": sampling.max_tokens, "seed": seed,
    }  # fmt: skip


async def _events(response: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """The JSON payloads of a server-sent event stream (`[DONE]` ends it)."""
    async for data in sse_payloads(response):
        if data == b"[DONE]":
            return
        try:
            event = json.loads(data)
        except ValueError:
            continue
        if isinstance(event, dict):
            yield event


def _take(event: dict[str, Any], api: str, reply: Reply, started: float) -> None:
    """Add one stream event to the reply."""
    if "error" in event and isinstance(event["error"], dict):
        reply.error = f"stream: {event['error'].get('message', 'error')}"
        return
    text, usage = "", None
    if api == "responses":
        kind = event.get("type")
        if kind == "error":
            reply.error = f"stream: {event.get('message', 'error')}"
        elif kind == "response.output_text.delta":
            text = str(event.get("delta", ""))
        elif kind in ("response.completed", "response.incomplete", "response.failed"):
            usage = (event.get("response") or {}).get("usage")
            if kind == "response.failed":
                reply.error = "stream: response.failed"
        if usage:
            reply.tokens_in += int(usage.get("input_tokens", 0))
            reply.tokens_out += int(usage.get("output_tokens", 0))
    else:
        for choice in event.get("choices") or ():
            text += (choice.get("delta") or {}).get("content") or ""
        usage = event.get("usage")
        if usage:
            reply.tokens_in += int(usage.get("prompt_tokens", 0))
            reply.tokens_out += int(usage.get("completion_tokens", 0))
    if text:
        if reply.ttft_s is None:
            reply.ttft_s = time.monotonic() - started
        reply.text += text
