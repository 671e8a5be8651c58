"""The ops listener: `/metrics` and `/admin/*` on their own port, and on the API port only
for an admin key, or not at all (server.ops)."""

from __future__ import annotations

import contextlib
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from aiohttp import web

from tests.e2e.stack import Gateway, model, start_gateway, tenant
from tests.e2e.upstreams import chat_upstream, serve_in_thread

MAX_CONNECTIONS = 8
TENANTS = {
    "acme": tenant("acme", ["*"]),
    "ops": tenant("ops", ["*"], admin=True),
}


async def answer(request: web.Request) -> web.Response:
    message = {"role": "assistant", "content": "ok"}
    choice = {"index": 0, "message": message, "finish_reason": "stop"}
    return web.json_response(
        {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [choice]}
    )


@contextlib.contextmanager
def gateway_with(
    tmp: pytest.TempPathFactory, redis_url: str, server: dict[str, Any], workers: int = 1
) -> Iterator[Gateway]:
    with serve_in_thread([chat_upstream(answer)]) as urls:
        gateway = start_gateway(
            tmp.mktemp("ops"),
            {"echo": model("openai", urls)},
            redis_url,
            tenants=TENANTS,
            gateway={"server": server},
            workers=workers,
        )
        try:
            yield gateway
        finally:
            gateway.process.terminate()
            gateway.process.wait(10)


@pytest.fixture(scope="module")
def gateway(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """Ops listener on, and `/metrics` and `/admin/*` on the API port for admin keys."""
    with gateway_with(tmp_path_factory, redis_url, {"max_connections": MAX_CONNECTIONS}) as gw:
        yield gw


def call(url: str, key: str | None = None, method: str = "GET") -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer sk-test-{key}"} if key else {}
    request = urllib.request.Request(url, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def error_code(body: bytes) -> str:
    code: str = orjson.loads(body)["error"]["code"]
    return code


def test_ops_listener_serves_metrics_without_a_key(gateway: Gateway) -> None:
    status, body = call(f"{gateway.ops_url}/metrics")
    assert status == 200
    assert b"gateway_config_info" in body


def test_api_port_serves_metrics_only_to_an_admin_key(gateway: Gateway) -> None:
    status, body = call(f"{gateway.url}/metrics")
    assert (status, error_code(body)) == (401, "invalid_api_key")
    status, body = call(f"{gateway.url}/metrics", key="acme")
    assert (status, error_code(body)) == (403, "not_admin")
    status, body = call(f"{gateway.url}/metrics", key="ops")
    assert status == 200 and b"gateway_config_info" in body


def test_admin_api_needs_an_admin_key_on_the_ops_listener_too(gateway: Gateway) -> None:
    # The reload is logged with who asked for it: an anonymous one has no one to name.
    status, body = call(f"{gateway.ops_url}/admin/reload", method="POST")
    assert (status, error_code(body)) == (401, "invalid_api_key")
    status, body = call(f"{gateway.ops_url}/admin/reload", key="ops", method="POST")
    assert status == 200 and orjson.loads(body)["applied"] is True


def test_ops_listener_does_not_serve_the_api(gateway: Gateway) -> None:
    status, body = call(f"{gateway.ops_url}/v1/chat/completions", key="acme", method="POST")
    message = orjson.loads(body)["error"]["message"]
    assert (status, message) == (404, "Invalid URL (POST /v1/chat/completions).")
    status, _ = call(f"{gateway.ops_url}/v1/models", key="acme")
    assert status == 404
    # The probes answer on both ports.
    assert call(f"{gateway.ops_url}/readyz")[0] == 200
    assert call(f"{gateway.url}/readyz")[0] == 200


def test_ops_listener_answers_while_the_api_port_is_full(gateway: Gateway) -> None:
    api_port = int(gateway.url.rsplit(":", 1)[1])
    held = []
    try:
        for _ in range(MAX_CONNECTIONS):
            held.append(socket.create_connection(("127.0.0.1", api_port)))
        # The API port is at its cap: the next connection is refused with a 503...
        refused = socket.create_connection(("127.0.0.1", api_port))
        refused.settimeout(10)
        assert refused.recv(4096).startswith(b"HTTP/1.1 503")
        refused.close()
        # ...while Prometheus still reaches the ops listener.
        status, body = call(f"{gateway.ops_url}/metrics")
        assert status == 200
        assert b'gateway_connections_closed_total{reason="too_many_connections"}' in body
    finally:
        for sock in held:
            sock.close()


def test_off_on_the_api_port_leaves_only_the_ops_listener(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    with gateway_with(
        tmp_path_factory, redis_url, {"ops": {"on_api_port": "off", "port": None}}
    ) as no_ops:
        # No ops listener and nothing on the API port: metrics and admin are off.
        assert call(f"{no_ops.url}/metrics", key="ops")[0] == 404
        assert call(f"{no_ops.url}/admin/reload", key="ops", method="POST")[0] == 404
        assert call(f"{no_ops.url}/readyz")[0] == 200


def test_two_workers_serve_the_ops_listener(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    with gateway_with(tmp_path_factory, redis_url, {"ops": {"on_api_port": "off"}}, 2) as two:
        # Several scrapes reach both workers: each answers on the ops port only.
        for _ in range(6):
            assert call(f"{two.ops_url}/metrics")[0] == 200
            assert call(f"{two.url}/metrics", key="ops")[0] == 404
