"""OpenAI-style upstreams of the tests' own: aiohttp apps served from a thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager

from aiohttp import web

from gateway_tools.dev.processes import free_port
from tests import ports

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def no_models(request: web.Request) -> web.Response:
    """`GET /v1/models`: enough for the gateway's health checks."""
    return web.json_response({"object": "list", "data": []})


def chat_upstream(answer: Handler) -> web.Application:
    """An OpenAI-style upstream whose `POST /v1/chat/completions` is `answer`, with the
    `GET /v1/models` the gateway's health checks need."""
    app = web.Application()
    app.router.add_get("/v1/models", no_models)
    app.router.add_post("/v1/chat/completions", answer)
    return app


@contextmanager
def serve_in_thread(apps: Sequence[web.Application]) -> Iterator[list[str]]:
    """Serve each app on a free port from an event loop in a thread; yield their URLs."""
    loop = asyncio.new_event_loop()
    runners: list[web.AppRunner] = []
    urls = []
    for app in apps:
        runner = web.AppRunner(app)
        loop.run_until_complete(runner.setup())
        start = ports.FAILING_UPSTREAMS + 1000 * len(urls)
        port = free_port(start=start, end=start + 1000)
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        runners.append(runner)
        urls.append(f"http://127.0.0.1:{port}")
    stopped = asyncio.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(stopped.wait())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield urls
    finally:
        loop.call_soon_threadsafe(stopped.set)
        thread.join(5)
        for runner in runners:
            loop.run_until_complete(runner.cleanup())
        loop.close()
