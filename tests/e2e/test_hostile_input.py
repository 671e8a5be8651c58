"""A hostile tenant's schemas against a live gateway (issue 24): a remote `$ref` is refused
and never fetched, a schema nested past any stack is a 400 (never a 500 and a
traceback), on every API that takes one; another tenant is served meanwhile."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest

from gateway_tools.dev.processes import stop
from gateway_tools.dev.sim.server import TritonSim
from tests.e2e.stack import KEYS, Gateway, default_tenants, model, start_gateway
from tests.listeners import silent_listener

MODEL = "hostile-small"
HELLO = [{"role": "user", "content": "hi"}]
Schema = dict[str, Any]


@pytest.fixture(scope="module")
def gateway(
    sims: tuple[TritonSim, TritonSim], redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    short = {"upstream_model": "llm-small", "max_tokens_limit": 8, "max_tokens_default": 4}
    models = {MODEL: model("triton_http", [sims[0].http_url], **short)}
    gw = start_gateway(
        tmp_path_factory.mktemp("hostile"), models, redis_url, tenants=default_tenants([MODEL])
    )
    try:
        yield gw
    finally:
        stop(gw.process)


@pytest.fixture
def listener() -> Iterator[tuple[str, list[bytes]]]:
    with silent_listener() as found:
        yield found


# Where each API takes a schema: (path, body with the schema in place, the param named).
Placement = Callable[[Schema], tuple[str, dict[str, Any], str]]
PLACEMENTS: dict[str, Placement] = {
    "chat response_format": lambda s: (
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": HELLO,
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": s}},
        },
        "response_format.json_schema.schema",
    ),
    "chat tool": lambda s: (
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": HELLO,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": s}}],
        },
        "tools[0].function.parameters",
    ),
    "responses text.format": lambda s: (
        "/v1/responses",
        {
            "model": MODEL,
            "input": "hi",
            "text": {"format": {"type": "json_schema", "name": "a", "schema": s}},
        },
        "text.format.schema",
    ),
    "responses tool": lambda s: (
        "/v1/responses",
        {
            "model": MODEL,
            "input": "hi",
            "tools": [{"type": "function", "name": "f", "parameters": s}],
        },
        "tools[0].parameters",
    ),
    "messages tool": lambda s: (
        "/v1/messages",
        {
            "model": MODEL,
            "max_tokens": 4,
            "messages": HELLO,
            "tools": [{"name": "f", "input_schema": s}],
        },
        "tools[0].input_schema",
    ),
    "count_tokens tool": lambda s: (
        "/v1/messages/count_tokens",
        {"model": MODEL, "messages": HELLO, "tools": [{"name": "f", "input_schema": s}]},
        "tools[0].input_schema",
    ),
}


# Written out as text: no JSON encoder (the client's own) takes 1,000 levels.
SCHEMA_HERE = "schema-goes-here"


def nested(levels: int) -> bytes:
    return b'{"type":"object","properties":{"a":' * levels + b'{"type":"string"}' + b"}}" * levels


def post(
    gw: Gateway, path: str, body: dict[str, Any], schema: bytes | None = None
) -> httpx.Response:
    headers = {
        "authorization": f"Bearer {KEYS['acme']}",
        "x-api-key": KEYS["acme"],
        "content-type": "application/json",
    }
    content = orjson.dumps(body)
    if schema is not None:
        content = content.replace(orjson.dumps(SCHEMA_HERE), schema)
    return httpx.post(f"{gw.url}{path}", content=content, headers=headers, timeout=30)


@pytest.mark.parametrize("keyword", ["$ref", "$schema"])
@pytest.mark.parametrize("where", PLACEMENTS)
def test_a_remote_ref_is_a_400_naming_it_and_nothing_is_fetched(
    gateway: Gateway, listener: tuple[str, list[bytes]], where: str, keyword: str
) -> None:
    # Attack: the gateway fetched the URL while checking the answer, with no timeout; a
    # listener that never answered froze the API for every tenant. A `$schema` naming
    # the listener made the tool schemas' meta-validation fetch it too, for 30 s.
    url, accepted = listener
    schema = {"type": "object", "properties": {"a": {keyword: url}}}
    path, body, param = PLACEMENTS[where](schema)
    response = post(gateway, path, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    why = "only references within the schema" if keyword == "$ref" else "standard drafts"
    assert url in error["message"] and why in error["message"]
    if path != "/v1/messages" and path != "/v1/messages/count_tokens":
        assert error["param"] == param
    # Another tenant is served all the while.
    other = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json={"model": MODEL, "messages": HELLO},
        headers={"authorization": f"Bearer {KEYS['globex']}"},
        timeout=30,
    )
    assert other.status_code == 200
    assert accepted == []


@pytest.mark.parametrize("levels", [100, 1000])
@pytest.mark.parametrize("where", PLACEMENTS)
def test_a_schema_nested_past_any_stack_is_a_400_not_a_500(
    gateway: Gateway, where: str, levels: int
) -> None:
    # Attack: 100 levels gave a 500 with a RecursionError traceback, 148 KB of log each.
    path, body, _ = PLACEMENTS[where](SCHEMA_HERE)  # type: ignore[arg-type]
    response = post(gateway, path, body, nested(levels))
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    # The schema's cap, the body's, or (past 1,024 levels) the JSON parser's own.
    assert any(cap in message for cap in ("levels deep", "depth limit"))
    assert "Traceback" not in gateway.log
    assert "RecursionError" not in gateway.log
