"""Which HTTP client should the proxy use? A bare Starlette proxy on aiohttp vs httpx.

    .venv/bin/python -m loadtest.client_stack [--seconds 10]

Each variant is a one-route Starlette app on uvicorn (one worker, uvloop, httptools) that
forwards the request body to an instant nginx upstream and returns its answer; wrk drives
it at concurrency 32. The gateway's backends use the winner.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from gateway.dev.processes import free_port, spawn, stop, wait_http_ok
from loadtest.instant_upstream import start_nginx
from loadtest.stack import wrk, wrk_script

UPSTREAM_ENV = "CLIENT_STACK_UPSTREAM"


def aiohttp_app() -> object:
    import aiohttp
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    upstream = os.environ[UPSTREAM_ENV]
    state: dict[str, aiohttp.ClientSession] = {}

    async def proxy(request: Request) -> Response:
        session = state.get("s") or state.setdefault("s", aiohttp.ClientSession())
        async with session.post(upstream, data=await request.body()) as r:
            return Response(await r.read(), r.status, media_type="application/json")

    return Starlette(routes=[Route("/v1/chat/completions", proxy, methods=["POST"])])


def httpx_app() -> object:
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
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=int, default=10)
    args = parser.parse_args()
    upstream_port = free_port()
    nginx, _ = start_nginx(upstream_port)
    script = wrk_script()
    env = dict(os.environ)
    env[UPSTREAM_ENV] = f"http://127.0.0.1:{upstream_port}/v1/chat/completions"
    print("| client | concurrency | requests/s | p50 ms | p99 ms |")
    print("|---|---|---|---|---|")
    try:
        for name in ("aiohttp", "httpx"):
            port = free_port(start=27000)
            app = spawn(
                [
                    sys.executable,
                    "-m",
                    "uvicorn",
                    "--factory",
                    f"loadtest.client_stack:{name}_app",
                    "--port",
                    str(port),
                    "--loop",
                    "uvloop",
                    "--http",
                    "httptools",
                    "--no-access-log",
                    "--log-level",
                    "warning",
                ],
                env=env,
            )
            try:
                url = f"http://127.0.0.1:{port}/v1/chat/completions"
                wait_http_ok(f"http://127.0.0.1:{upstream_port}/v1/models", 10, nginx)
                for _ in range(50):  # until the app listens
                    try:
                        wrk(url, 4, 1, script)
                        break
                    except subprocess.CalledProcessError:
                        time.sleep(0.2)
                r = wrk(url, 32, args.seconds, script)
                print(f"| {name} | 32 | {r['rps']:.0f} | {r['p50']:.2f} | {r['p99']:.2f} |")
            finally:
                stop(app)
    finally:
        stop(nginx)


if __name__ == "__main__":
    main()
