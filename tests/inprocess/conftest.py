"""The gateway app built in this process over a fake upstream (`fake_backend`), with its
lifespan run, and clients that call it through ASGI: no HTTP socket to the gateway.
Redis is the session's own redis-server (`tests/conftest.py`), under a key prefix of
each test's own, so no limit or stored answer leaks from one test into another."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest
import yaml
from starlette.types import ASGIApp, Message

import gateway.serving.runtime
from gateway.app import build_app
from gateway.config import hash_key
from gateway.config.loader import load_config
from gateway.observability.access import RequestRecord
from tests.inprocess.fake_backend import FakeUpstream, backend_factory

BASE_URL = "http://gateway.test"
KEYS = {"acme": "sk-test-acme", "tight": "sk-test-tight", "globex": "sk-test-globex"}

_FAST_RETRY = {"backoff_base_s": 0.001, "backoff_cap_s": 0.005}


def gateway_yaml(redis_url: str, key_prefix: str) -> dict[str, Any]:
    """llm-large (Triton HTTP, two replicas, falls back to llm-small on replica errors),
    llm-small (Triton HTTP), relay (an OpenAI-compatible upstream) and embed-small (an
    embedding model). Replica URLs have no port: no Triton metrics URL is derived, so
    the health checker scrapes nothing."""
    return {
        "redis": {"url": redis_url, "key_prefix": key_prefix},
        "tenants_file": "tenants.yaml",
        "models": {
            "llm-large": {
                "backend": "triton_http",
                "replicas": [{"url": "http://large-a"}, {"url": "http://large-b"}],
                "prompt_template": "chatml",
                "max_tokens_default": 64,
                "aliases": ["gpt-*"],
                "fallback": ["llm-small"],
                "fallback_on": ["replica_error"],
                "retry": _FAST_RETRY,
            },
            "llm-small": {
                "backend": "triton_http",
                "replicas": [{"url": "http://small-a"}],
                "prompt_template": "chatml",
                "max_tokens_default": 64,
                "retry": _FAST_RETRY,
            },
            "relay": {
                "backend": "openai",
                "upstream_model": "relayed-model",
                "replicas": [{"url": "http://relay-a/v1"}],
                "max_tokens_default": 64,
                "retry": _FAST_RETRY,
            },
            "embed-small": {
                "backend": "triton_http",
                "replicas": [{"url": "http://embed-a"}],
                "capabilities": {"embeddings": {"dimensions": 4, "max_batch": 8}},
            },
        },
    }


def tenants_yaml() -> dict[str, Any]:
    """acme: every model, no limits; tight: 2 requests a minute; globex: llm-small only."""

    def tenant(name: str, models: list[str], **settings: Any) -> dict[str, Any]:
        return {"api_keys": [hash_key(KEYS[name])], "models": models, **settings}

    return {
        "tenants": {
            "acme": tenant("acme", ["*"], priority="online"),
            "tight": tenant(
                "tight",
                ["*"],
                limits={"requests_per_minute": 2, "burst_requests": 2},
            ),
            "globex": tenant("globex", ["llm-small"], priority="batch"),
        }
    }


@asynccontextmanager
async def running(app: ASGIApp) -> AsyncIterator[None]:
    """Run `app`'s ASGI lifespan: startup before the block, shutdown after it (httpx's
    ASGITransport sends no lifespan events)."""
    inbox: asyncio.Queue[Message] = asyncio.Queue()
    outbox: asyncio.Queue[Message] = asyncio.Queue()
    scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
    task = asyncio.create_task(app(scope, inbox.get, outbox.put))  # type: ignore[arg-type]

    async def step(event: str) -> None:
        await inbox.put({"type": f"lifespan.{event}"})
        reply = await asyncio.wait_for(outbox.get(), timeout=10)
        if reply["type"] != f"lifespan.{event}.complete":
            raise RuntimeError(f"lifespan {event} failed: {reply}")

    await step("startup")
    try:
        yield
    finally:
        await step("shutdown")
        await asyncio.wait_for(task, timeout=10)


@dataclass
class InProcessGateway:
    app: ASGIApp
    upstream: FakeUpstream
    config_dir: Path

    def finished_records(self) -> list[RequestRecord]:
        """From now on, each request's record once it is finished, in this list (what the
        usage ledger would be handed)."""
        records: list[RequestRecord] = []
        runtime = self.app.app.state.runtime  # type: ignore[attr-defined]
        runtime.record_sink = lambda record, _duration: records.append(record)
        return records

    def http(self, key: str | None = KEYS["acme"], **headers: str) -> httpx.AsyncClient:
        """An httpx client of the app, authenticated as `key` (None: no key)."""
        if key is not None:
            headers = {"authorization": f"Bearer {key}", **headers}
        return httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app), base_url=BASE_URL, headers=headers
        )

    def openai(self, key: str = KEYS["acme"]) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=f"{BASE_URL}/v1",
            api_key=key,
            max_retries=0,
            http_client=self._sdk_http(),
        )

    def anthropic(self, key: str = KEYS["acme"]) -> anthropic.AsyncAnthropic:
        return anthropic.AsyncAnthropic(
            base_url=BASE_URL,
            api_key=key,
            max_retries=0,
            http_client=self._sdk_http(),
        )

    def _sdk_http(self) -> httpx2.AsyncClient:
        # The SDKs are built on httpx2 (the anthropic one refuses an httpx client).
        return httpx2.AsyncClient(transport=httpx2.ASGITransport(app=self.app))


_prefixes = itertools.count()


@pytest.fixture
def config_for(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., Path]:
    """Writes gateway.yaml and tenants.yaml into tmp_path, each changed by its edit (a
    function of its dict) if given; returns gateway.yaml's path."""
    monkeypatch.delenv("GATEWAY_REDIS_URL", raising=False)

    def write(
        edit: Callable[[dict[str, Any]], None] | None = None,
        edit_tenants: Callable[[dict[str, Any]], None] | None = None,
    ) -> Path:
        prefix = f"inproc{next(_prefixes)}-{tmp_path.name}"
        config, tenants = gateway_yaml(redis_url, prefix), tenants_yaml()
        if edit is not None:
            edit(config)
        if edit_tenants is not None:
            edit_tenants(tenants)
        (tmp_path / "tenants.yaml").write_text(yaml.safe_dump(tenants))
        path = tmp_path / "gateway.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    return write


@asynccontextmanager
async def started_gateway(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[InProcessGateway]:
    """The app of the config at `path`, every model's backend a fake, lifespan running."""
    upstream = FakeUpstream()
    # Runtime.build makes each route's backend with `_backend(model)`: every one is fake.
    monkeypatch.setattr(gateway.serving.runtime, "_backend", backend_factory(upstream))
    app = build_app(load_config(str(path)))
    async with running(app):
        yield InProcessGateway(app, upstream, path.parent)


@pytest.fixture
async def gw(
    config_for: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[InProcessGateway]:
    """The gateway of the default config."""
    async with started_gateway(config_for(), monkeypatch) as started:
        yield started
