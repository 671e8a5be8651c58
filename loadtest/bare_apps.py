"""Yardsticks for the gateway: the least a Python server on the same stack can do.

- `raw_app`: one Starlette route that reads the request and returns a fixed chat
  completion, no upstream. Its requests/s bounds what any app on Starlette, uvicorn,
  uvloop and httptools serves on this machine.
- the bare proxy, `loadtest.client_stack:aiohttp_app` (`BARE_PROXY`): the body forwarded
  to an upstream through one pooled aiohttp session and its answer relayed. Its CPU per
  request is the least a proxy on this stack spends.

Both run as the gateway does at `--workers 1`: `uvicorn_command` starts one uvicorn
process (the server in that process, no supervisor), uvloop, httptools, no access log.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time

from loadtest.instant_upstream import CHAT_RESPONSE

# uvicorn factories ("module:function") of the two yardsticks.
RAW_STARLETTE = "loadtest.bare_apps:raw_app"
BARE_PROXY = "loadtest.client_stack:aiohttp_app"


def raw_app() -> object:
    """A Starlette app whose one POST route answers a fixed small chat completion."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    answer = CHAT_RESPONSE.encode()

    async def chat(request: Request) -> Response:
        # The body read, as any real app must before it can answer.
        await request.body()
        return Response(answer, media_type="application/json")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def uvicorn_command(factory: str, port: int) -> list[str]:
    """uvicorn serving the app `factory` makes on 127.0.0.1:`port` as `gateway serve
    --workers 1` serves the gateway: one process, uvloop, httptools, no access log."""
    return [
        sys.executable, "-m", "uvicorn", "--factory", factory,
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
        "--loop", "uvloop", "--http", "httptools",
        "--no-access-log", "--log-level", "warning",
    ]  # fmt: skip


def wait_listening(port: int, timeout_s: float, process: subprocess.Popen[bytes]) -> None:
    """Wait until something accepts connections on 127.0.0.1:`port` (the bare apps have
    no GET route to poll); fail early if `process` exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listens on port {port} after {timeout_s:g}s")
