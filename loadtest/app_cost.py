"""The gateway's own CPU per request: its ASGI app called in process, no HTTP server.

    .venv/bin/python -m loadtest.app_cost [--requests 20000] [--concurrency 32]
        [--stream] [--profile 40] [--baseline DIR] [--tracing]

Builds the app from loadtest/bench-config (auth, Redis Lua limits, admission, metrics,
JSON access logs at INFO, all on) against a redis-server of its own, with every model's
backend replaced by one that answers at once (a fixed completion, or a fixed stream of
20 pieces). Requests are sent straight to the ASGI callable, `--concurrency` at a time,
and the process's CPU time is divided by the requests served. What uvicorn and the
upstream HTTP client cost is left out, so the figure is the part of a request's cost
that the gateway's own code decides; `--profile N` prints cProfile's top N functions
by own time. Figures of one run only compare with figures of the same run (`--baseline`
runs another source tree's app in a child process, interleaved round by round).
`--tracing` also measures this tree with OpenTelemetry tracing on at 1% and at 100%,
exporting over OTLP/HTTP to a receiver in this process (its CPU not counted).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import logging
import os
import pstats
import sys
import time
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

from loadtest.child_rounds import measure_by_turns, own_redis, print_figures, trees_to_measure

ROOT = Path(__file__).resolve().parent.parent
BODY = b'{"model":"fake-llama-8b","messages":[{"role":"user","content":"Hello"}],"max_tokens":16}'
STREAM_BODY = (
    b'{"model":"fake-llama-8b-stream","messages":[{"role":"user","content":"Hello"}],'
    b'"max_tokens":20,"stream":true}'
)
KEY = b"Bearer sk-bench-1234"
PIECES = 20


class InstantBackend:
    """A backend that answers every request at once: the upstream costs nothing."""

    renders_prompt = False

    async def complete(self, url: str, call: Any) -> Any:
        from gateway.inference.types import Completion, Usage

        return Completion(text="Hi there!", usage=Usage(prompt_tokens=9, completion_tokens=3))

    async def stream(self, url: str, call: Any) -> AsyncGenerator[Any, None]:
        from gateway.inference.types import Delta

        for index in range(PIECES):
            yield Delta(
                text="tok", output_tokens=1, finish_reason="length" if index == 19 else None
            )

    async def ready(self, url: str, upstream_model: str, timeout_s: float) -> bool:
        return True

    async def close(self) -> None:
        return None


def _scope(body: bytes) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1:8080"),
            (b"authorization", KEY),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8080),
        "state": {},
    }


async def _one(app: Any, body: bytes) -> int:
    status = 0
    sent = False
    done = asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()  # the client stays until the answer is whole
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body" and not message.get("more_body"):
            done.set()

    await app(_scope(body), receive, send)
    return status


async def _lifespan(app: Any) -> tuple[asyncio.Task[None], asyncio.Queue[Any]]:
    inbox: asyncio.Queue[Any] = asyncio.Queue()
    outbox: asyncio.Queue[Any] = asyncio.Queue()
    await inbox.put({"type": "lifespan.startup"})
    task = asyncio.create_task(app({"type": "lifespan", "state": {}}, inbox.get, outbox.put))
    started = await outbox.get()
    if started["type"] != "lifespan.startup.complete":
        raise SystemExit(f"the app did not start: {started}")
    return task, inbox


async def _measure(
    app: Any, body: bytes, requests: int, concurrency: int, profile: cProfile.Profile | None
) -> float:
    """CPU seconds per request over `requests` requests, `concurrency` at a time."""
    for _ in range(200):  # warm: caches, connections, scripts loaded
        await _one(app, body)
    statuses: dict[int, int] = {}
    cpu = time.process_time()
    if profile is not None:
        profile.enable()
    for _ in range(requests // concurrency):
        for status in await asyncio.gather(*(_one(app, body) for _ in range(concurrency))):
            statuses[status] = statuses.get(status, 0) + 1
    if profile is not None:
        profile.disable()
    spent = time.process_time() - cpu
    if set(statuses) != {200}:
        raise SystemExit(f"not every request was answered 200: {statuses}")
    return spent / (requests // concurrency * concurrency)


def _app(redis_url: str) -> Any:
    from gateway.config.loader import load_config
    from gateway.observability.logging import configure_logging
    from gateway.serving import runtime

    os.environ["BENCH_REDIS_URL"] = redis_url
    runtime._backend = lambda model: InstantBackend()  # type: ignore[assignment,return-value]
    configure_logging()
    # The access lines go where the gateway's go (stderr, a pipe), not to the terminal.
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(open(os.devnull, "w"))  # noqa: SIM115 (kept for the run)
    from gateway.app import build_app

    return build_app(load_config(str(ROOT / "loadtest/bench-config/gateway.yaml")))


async def _child(redis_url: str, requests: int, concurrency: int, stream: bool) -> None:
    """Serve one measurement per line read on stdin, printing µs per request."""
    app = _app(redis_url)
    _, _ = await _lifespan(app)
    body = STREAM_BODY if stream else BODY
    loop = asyncio.get_running_loop()
    while (await loop.run_in_executor(None, sys.stdin.readline)).strip():
        per_request = await _measure(app, body, requests, concurrency, None)
        print(json.dumps(per_request * 1e6), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--profile", type=int, default=0, help="print cProfile's top N")
    parser.add_argument("--sort", default="tottime", help="cProfile's order (cumtime...)")
    parser.add_argument("--baseline", type=Path, help="another source tree, interleaved")
    parser.add_argument("--tracing", action="store_true", help="also tracing at 1% and 100%")
    parser.add_argument("--redis-url", help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import uvloop

        uvloop.run(_child(args.redis_url, args.requests, args.concurrency, args.stream))
        return

    with own_redis() as redis_url:
        child_args = [
            "--redis-url", redis_url,
            "--requests", str(args.requests),
            "--concurrency", str(args.concurrency),
            *(["--stream"] if args.stream else []),
        ]  # fmt: skip
        trees = trees_to_measure(ROOT, args.baseline)
        envs: dict[str, dict[str, str]] = {}
        receiver = None
        if args.tracing:
            from gateway_tools.dev.otlp_receiver import OtlpReceiver, SpanFile
            from gateway_tools.dev.processes import free_port

            receiver = OtlpReceiver(SpanFile(None), free_port(start=24500)).start()
            for name, ratio in (("tracing 1%", "0.01"), ("tracing 100%", "1.0")):
                trees[name] = ROOT
                envs[name] = {
                    "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.http_port}",
                    "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                    "OTEL_TRACES_SAMPLER_ARG": ratio,
                }
        try:
            figures = measure_by_turns("loadtest.app_cost", child_args, trees, args.rounds, envs)
        finally:
            if receiver is not None:
                receiver.stop()
        print_figures(figures, "µs per stream" if args.stream else "µs per request")
        if receiver is not None:
            print(f"spans received: {receiver.spans.received}")
        if args.profile:
            _profile(redis_url, args)


def _profile(redis_url: str, args: argparse.Namespace) -> None:
    async def run() -> None:
        app = _app(redis_url)
        await _lifespan(app)
        profile = cProfile.Profile()
        body = STREAM_BODY if args.stream else BODY
        await _measure(app, body, args.requests, args.concurrency, profile)
        out = io.StringIO()
        stats = pstats.Stats(profile, stream=out)
        stats.sort_stats(args.sort).print_stats(args.profile)
        print(out.getvalue())

    import uvloop

    uvloop.run(run())


if __name__ == "__main__":
    main()
