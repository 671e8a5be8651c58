"""Which HTTP client should the proxy use? A bare Starlette proxy on aiohttp vs httpx.

    .venv/bin/python -m loadtest.client_stack [--seconds 10]

Each variant is a one-route Starlette app on uvicorn (one worker, uvloop, httptools) that
forwards the request body to an instant nginx upstream and returns its answer; wrk drives
it at concurrency 32. The gateway's backends use the winner.
"""

from __future__ import annotations

import argparse
import os

from gateway_tools.dev.processes import free_port, spawn, stop, wait_http_ok
from loadtest.bare_apps import uvicorn_command, wait_listening
from loadtest.instant_upstream import UPSTREAM_PORTS, start_nginx
from loadtest.stack import wrk, wrk_script

UPSTREAM_ENV = "CLIENT_STACK_UPSTREAM"


def aiohttp_app() -> object:
    """The bare proxy: the body posted to the upstream through one pooled aiohttp
    session, its answer relayed (also loadtest/bench's yardstick, loadtest/bare_apps.py)."""
    import aiohttp
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    upstream = os.environ[UPSTREAM_ENV]
    state: dict[str, aiohttp.ClientSession] = {}

    async def proxy(request: Request) -> Response:
        # Made in the running loop; unbounded like the gateway's (aiohttp's default of
        # 100 connections would queue requests in the pool at concurrency 128).
        session = state.get("s") or state.setdefault(
            "s", aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        )
        async with session.post(upstream, data=await request.body()) as r:
            return Response(await r.read(), r.status, media_type="application/json")

    return Starlette(routes=[Route("/v1/chat/completions", proxy, methods=["POST"])])


def httpx_app() -> object:
    """The same proxy on httpx."""
    import httpx
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    upstream = os.environ[UPSTREAM_ENV]
    client = httpx.AsyncClient(limits=httpx.Limits(max_connections=None))

    async def proxy(request: Request) -> Response:
        r = await client.post(upstream, content=await request.body())
        return Response(r.content, r.status_code, media_type="application/json")

    return Starlette(routes=[Route("/v1/chat/completions", proxy, methods=["POST"])])


def main() -> None:
    """Each client's proxy in turn, wrk at concurrency 32, a Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=int, default=10)
    args = parser.parse_args()
    upstream_port = free_port(span=UPSTREAM_PORTS)
    nginx, _ = start_nginx(upstream_port)
    script = wrk_script()
    env = dict(os.environ)
    env[UPSTREAM_ENV] = f"http://127.0.0.1:{upstream_port}/v1/chat/completions"
    print("| client | concurrency | requests/s | p50 ms | p99 ms |")
    print("|---|---|---|---|---|")
    try:
        for name in ("aiohttp", "httpx"):
            port = free_port(start=27000)
            app = spawn(uvicorn_command(f"loadtest.client_stack:{name}_app", port), env=env)
            try:
                url = f"http://127.0.0.1:{port}/v1/chat/completions"
                wait_http_ok(f"http://127.0.0.1:{upstream_port}/v1/models", 10, nginx)
                wait_listening(port, 10, app)
                wrk(url, 4, 1, script)  # warm up
                r = wrk(url, 32, args.seconds, script)
                print(f"| {name} | 32 | {r['rps']:.0f} | {r['p50']:.2f} | {r['p99']:.2f} |")
            finally:
                stop(app)
    finally:
        stop(nginx)


if __name__ == "__main__":
    main()
