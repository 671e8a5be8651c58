"""Locust users for the traffic the gateway sees, against any deployment of it.

    .venv/bin/locust -f loadtest/locustfile.py --headless -u 50 -r 10 -t 60s \\
        --host http://127.0.0.1:8080

Three kinds of client, each on its own tenant and model from a small YAML file
(`loadtest/locust-tenants.yaml`, or the path in `LOCUST_TENANTS`):

- `InteractiveChatUser`: streamed chat with `stream_options.include_usage`; reports
  time to first token ("TTFT") and generation speed ("TOKENS/S") as custom entries.
- `BatchCompletionUser`: non-streamed `/v1/completions` with a larger `max_tokens`.
- `BurstyUser`: one client that fires concurrent bursts to meet its tenant's limits.

Expected refusals (429, and 503 with `Retry-After`) are the gateway doing its job, so
they are not failures: the request is marked a success and a separate "REFUSED" entry
("429" or "503") counts them. Anything else that is not a complete answer (another
status, a 503 without `Retry-After`, a stream's terminal error event, a stream cut
short, a connection error) is a failure, and Locust then exits with
`--exit-code-on-error` (1 by default).
"""

from __future__ import annotations

import json
import os
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gevent.pool
import yaml
from locust import FastHttpUser, between, events, task
from locust.contrib.fasthttp import ResponseContextManager
from locust.env import Environment

TENANTS_ENV = "LOCUST_TENANTS"
DEFAULT_TENANTS = Path(__file__).with_name("locust-tenants.yaml")

# The demo's tenants (README.md): what a missing file or entry falls back to.
DEFAULT_PROFILES: dict[str, dict[str, Any]] = {
    "interactive": {"key": "sk-acme-demo", "model": "llm-large", "max_tokens": 32},
    "batch": {"key": "sk-globex-demo", "model": "llm-small", "max_tokens": 256},
    "bursty": {"key": "sk-globex-demo", "model": "llm-small", "max_tokens": 4, "burst": 40},
}

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")

PROMPTS = [
    "Summarise the plot of Hamlet in three sentences.",
    "Write a haiku about load balancers.",
    "Explain what a token bucket is to a new engineer.",
    "List five things to check when a service is slow.",
    "Translate 'good morning, how are you?' into French.",
]


def resolve_env(value: str) -> str:
    """Substitute `${VAR}` and `${VAR:-default}`, so keys need not live in the file."""

    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        raise ValueError(f"{name} is referenced in the locust tenants file but not set")

    return _ENV_REF.sub(substitute, value)


@dataclass(frozen=True)
class Profile:
    """Who one user class speaks as, and what it asks for."""

    key: str
    model: str
    max_tokens: int
    burst: int = 1


def load_profiles(path: Path | None = None) -> dict[str, Profile]:
    """Read `users:` from the tenants file; missing users or fields keep the demo's."""
    path = path or Path(os.environ.get(TENANTS_ENV) or DEFAULT_TENANTS)
    users: dict[str, Any] = {}
    if path.exists():
        users = (yaml.safe_load(path.read_text()) or {}).get("users") or {}
    elif TENANTS_ENV in os.environ:
        # An explicitly named file that is missing is a mistake, not a reason to
        # silently load-test the demo's tenants instead.
        raise FileNotFoundError(f"{TENANTS_ENV}={path} does not exist")
    profiles = {}
    for name, defaults in DEFAULT_PROFILES.items():
        merged = {**defaults, **(users.get(name) or {})}
        profiles[name] = Profile(
            key=resolve_env(str(merged["key"])),
            model=str(merged["model"]),
            max_tokens=int(merged["max_tokens"]),
            burst=int(merged.get("burst", 1)),
        )
    return profiles


PROFILES = load_profiles()


@dataclass
class StreamResult:
    """What one SSE response carried."""

    first_token_s: float | None = None  # since the request was sent
    text_chunks: int = 0
    completion_tokens: int | None = None  # from the usage event, when sent
    error: dict[str, Any] | None = None
    done: bool = False
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        # The usage event is exact; counting text chunks is the fallback (one
        # chunk is about one token for the gateway's backends).
        return self.completion_tokens if self.completion_tokens is not None else self.text_chunks


def read_sse(response: ResponseContextManager, started: float) -> StreamResult:
    """Consume an OpenAI SSE stream, timing the first text and spotting error events."""
    result = StreamResult()
    # iter_content(n) blocks until n bytes have arrived, which would bunch the events
    # together; geventhttpclient's readline returns each event as soon as it is whole.
    raw = response._response
    if raw is None:
        raise ConnectionError("no response body")
    while event := raw.readline(b"\n\n"):
        for line in event.decode().splitlines():
            if line.startswith("data:"):
                _take_event(result, line[5:].strip(), started)
        if result.done or result.error is not None:
            break
    return result


def _take_event(result: StreamResult, data: str, started: float) -> None:
    if data == "[DONE]":
        result.done = True
        return
    payload = json.loads(data)
    if "error" in payload:
        result.error = payload["error"]
        return
    if payload.get("usage"):
        result.completion_tokens = int(payload["usage"]["completion_tokens"])
    for choice in payload.get("choices") or []:
        text = (choice.get("delta") or {}).get("content") or choice.get("text")
        if text:
            result.text_chunks += 1
            if result.first_token_s is None:
                result.first_token_s = time.perf_counter() - started


class GatewayUser(FastHttpUser):
    """Shared plumbing: the tenant's key, and refusals counted apart from failures."""

    abstract = True
    profile_name = ""
    network_timeout = 120.0  # a long batch completion is not a hung connection

    def on_start(self) -> None:
        self.profile = PROFILES[self.profile_name]
        self.auth = {"Authorization": f"Bearer {self.profile.key}"}

    def refused(self, response: ResponseContextManager) -> bool:
        """Count a 429, or a 503 with Retry-After, as "REFUSED", not as a failure."""
        status = response.status_code
        retry_after = (response.headers or {}).get("retry-after")
        if status == 429 or (status == 503 and retry_after):
            response.success()
            self.environment.events.request.fire(
                request_type="REFUSED",
                name=str(status),
                response_time=response.request_meta["response_time"],
                response_length=0,
                exception=None,
                context={"user": type(self).__name__},
            )
            return True
        return False

    def metric(self, request_type: str, name: str, value: float) -> None:
        """A custom entry whose "response time" column carries `value`."""
        self.environment.events.request.fire(
            request_type=request_type,
            name=name,
            response_time=value,
            response_length=0,
            exception=None,
            context={},
        )


def _http_failure(response: ResponseContextManager) -> str:
    if response.status_code == 0:  # no HTTP answer at all
        return f"connection error: {getattr(response, 'error', None)!r}"
    return f"HTTP {response.status_code}: {(response.text or '')[:200]}"


class InteractiveChatUser(GatewayUser):
    """A person chatting: streamed answers, a few seconds of reading between them."""

    profile_name = "interactive"
    weight = 6
    wait_time = between(0.5, 2.0)

    @task
    def chat(self) -> None:
        body = {
            "model": self.profile.model,
            "messages": [{"role": "user", "content": random.choice(PROMPTS)}],
            "max_tokens": self.profile.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        started = time.perf_counter()
        with self.client.post(
            "/v1/chat/completions",
            json=body,
            headers=self.auth,
            name="chat (stream)",
            stream=True,
            catch_response=True,
        ) as response:
            if self.refused(response):
                return
            if response.status_code != 200:
                response.failure(_http_failure(response))
                return
            try:
                result = read_sse(response, started)
            except Exception as exc:  # a cut connection or a malformed event
                response.failure(f"stream broken: {exc!r}")
                return
            elapsed = time.perf_counter() - started
            # With stream=True Locust stops the clock at the headers; the whole
            # stream is what a user waits for.
            response.request_meta["response_time"] = elapsed * 1000
            if result.error is not None:
                response.failure(f"stream error event: {result.error.get('message')}")
                return
            if not result.done:
                response.failure("stream ended without [DONE]")
                return
            response.success()
        if result.first_token_s is not None:
            self.metric("TTFT", self.profile.model, result.first_token_s * 1000)
            generating = elapsed - result.first_token_s
            # Decode speed after the first token; a one-token answer has none.
            if result.tokens > 1 and generating > 0:
                self.metric("TOKENS/S", self.profile.model, (result.tokens - 1) / generating)


class BatchCompletionUser(GatewayUser):
    """An offline job: long non-streamed completions, paced by its own work."""

    profile_name = "batch"
    weight = 3
    wait_time = between(3.0, 8.0)

    @task
    def complete(self) -> None:
        body = {
            "model": self.profile.model,
            "prompt": random.choice(PROMPTS),
            "max_tokens": self.profile.max_tokens,
        }
        with self.client.post(
            "/v1/completions",
            json=body,
            headers=self.auth,
            name="completion (batch)",
            catch_response=True,
        ) as response:
            if self.refused(response):
                return
            if response.status_code != 200:
                response.failure(_http_failure(response))
                return
            try:
                answer = response.json()
                tokens = int(answer["usage"]["completion_tokens"])
                if not isinstance(answer["choices"][0]["text"], str):
                    raise TypeError("choices[0].text is not a string")
            except (ValueError, KeyError, IndexError, TypeError) as exc:
                response.failure(f"not a completion: {exc!r}")
                return
            response.success()
        seconds = response.request_meta["response_time"] / 1000
        if tokens and seconds > 0:
            self.metric("TOKENS/S", f"{self.profile.model} (batch)", tokens / seconds)


class BurstyUser(GatewayUser):
    """A client that fans out `burst` requests at once, then goes quiet.

    Exactly one per run (`fixed_count`), whatever `-u` is: its job is to meet its
    tenant's limits, and the refusals it gets are the point.
    """

    profile_name = "bursty"
    fixed_count = 1
    wait_time = between(3.0, 5.0)
    # One connection per request of a burst; FastHttpUser's pool is 10 by default.
    concurrency = 64

    @task
    def burst(self) -> None:
        pool = gevent.pool.Pool(self.profile.burst)
        for _ in range(self.profile.burst):
            pool.spawn(self.one)
        pool.join()

    def one(self) -> None:
        body = {
            "model": self.profile.model,
            "messages": [{"role": "user", "content": random.choice(PROMPTS)}],
            "max_tokens": self.profile.max_tokens,
        }
        with self.client.post(
            "/v1/chat/completions",
            json=body,
            headers=self.auth,
            name="chat (burst)",
            catch_response=True,
        ) as response:
            if self.refused(response):
                return
            if response.status_code != 200:
                response.failure(_http_failure(response))
                return
            response.success()


@events.quitting.add_listener
def _fail_when_nothing_was_served(environment: Environment, **_: Any) -> None:
    """A run where every request was refused tested nothing: make it exit non-zero."""
    stats = environment.stats
    if stats is None or environment.runner is None or environment.runner.errors:
        return  # failures already give --exit-code-on-error
    refused = sum(e.num_requests for e in stats.entries.values() if e.method == "REFUSED")
    metrics = {"REFUSED", "TTFT", "TOKENS/S"}
    answered = sum(e.num_requests for e in stats.entries.values() if e.method not in metrics)
    if answered and answered <= refused:
        environment.process_exit_code = 1
