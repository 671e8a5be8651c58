"""Issue 24's attack table, re-run against the demo: what a hostile tenant gets now.

    .venv/bin/python -m loadtest.attacks_untrusted

Starts `gateway demo` on free ports and tries, as the issue wrote them, the attacks on
what lies behind the edge: schemas that fetch or backtrack, a client that leaves before
its answer, huge and deep tool schemas, reads that were not metered, a malformed
`tool_choice`, half-open connections from one address. Prints one row per attack.
Nothing here asserts (the tests named in each row do); this is the attacker's view.
The rows that need parts the demo does not have (the eval sandbox, an external model,
a paused Redis, an upstream failing mid-stream) are measured by their own tests.
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from gateway_tools.dev.processes import free_port, gateway_command, spawn, stop, wait_gateway_ready
from loadtest.attacks import ACME, GLOBEX, Row, call, chat, error_of, raw

HELLO = [{"role": "user", "content": "hi"}]


def timed(send: Callable[[], tuple[int, dict[str, str], bytes]]) -> tuple[float, int, bytes]:
    started = time.monotonic()
    status, _, body = send()
    return time.monotonic() - started, status, body


def while_running(
    attack: Callable[[], tuple[int, dict[str, str], bytes]], port: int
) -> tuple[tuple[float, int, bytes], float]:
    """The attack's (seconds, status, body), and how long another tenant's request took
    while it ran."""
    result: list[tuple[float, int, bytes]] = []
    thread = threading.Thread(target=lambda: result.append(timed(attack)))
    thread.start()
    time.sleep(0.05)
    other, _, _ = timed(lambda: chat(port, {"model": "llm-small", "messages": HELLO}, GLOBEX))
    thread.join()
    return result[0], other


def silent_listener() -> tuple[str, list[int], Callable[[], None]]:
    """A listener that accepts and never answers; the list counts its connections."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    accepted = [0]
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                server.accept()[0].detach()
                accepted[0] += 1
            except TimeoutError:
                continue
            except OSError:  # closed under it: the attack is over
                return

    threading.Thread(target=accept, daemon=True).start()

    def close() -> None:
        done.set()
        server.close()

    return f"http://127.0.0.1:{server.getsockname()[1]}/s.json", accepted, close


def schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}


def remaining_tokens(port: int) -> int:
    _, headers, _ = chat(port, {"model": "llm-small", "messages": HELLO, "max_tokens": 1})
    return int({k.lower(): v for k, v in headers.items()}["x-ratelimit-remaining-tokens"])


def leave_early(port: int, body: dict[str, Any], after_s: float) -> None:
    payload = orjson.dumps(body)
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"authorization: Bearer {ACME}\r\ncontent-length: {len(payload)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(head.encode() + payload)
        time.sleep(after_s)


def raw_status(port: int, payload: bytes) -> str:
    try:
        return raw(port, payload).split(b"\r\n")[0].decode() or "closed"
    except OSError as exc:
        return f"{type(exc).__name__}"


def nested(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def rows(port: int) -> list[Row]:
    base = f"http://127.0.0.1:{port}"
    out: list[Row] = []

    url, accepted, close = silent_listener()
    body = {"model": "llm-large", "messages": HELLO, "max_tokens": 8}
    body["response_format"] = schema_format({"$ref": url})
    (took, status, answer), other = while_running(lambda: chat(port, body), port)
    close()
    out.append((
        "`response_format` schema with `$ref` to a listener that never answers",
        f"{status} in {took:.2f} s ({error_of(answer)[60:170]}); listener contacted "
        f"{accepted[0]} times; another tenant's request took {other:.2f} s",
        "tests/e2e/test_hostile_input.py",
    ))  # fmt: skip

    redos = {"type": "object", "properties": {"a": {"type": "string", "pattern": "^(a+)+$"}}}
    body = {"model": "llm-large", "messages": HELLO, "max_tokens": 40}
    body["response_format"] = schema_format(redos)
    (took, status, answer), other = while_running(lambda: chat(port, body), port)
    out.append((
        'schema with `"pattern": "^(a+)+$"` the answer must match',
        f"{status} in {took:.2f} s ({error_of(answer)[:70] if status != 200 else 'answered'});"
        f" another tenant's request took {other:.2f} s",
        "tests/unit/inference/test_schemas.py",
    ))  # fmt: skip

    # At once, and read at once: acme's bucket refills 3,333 tokens a second.
    before = remaining_tokens(port)
    leaving = {"model": "llm-large", "messages": HELLO, "max_tokens": 1024}
    started = time.monotonic()
    # 0.2 s: before the shortest answer llm-large writes (8 tokens, 40 ms each).
    clients = [threading.Thread(target=leave_early, args=(port, leaving, 0.2)) for _ in range(16)]
    for client in clients:
        client.start()
    for client in clients:
        client.join()
    after = remaining_tokens(port)
    refill = round((time.monotonic() - started) * 200_000 / 60)
    out.append((
        "16 non-streamed requests (max_tokens 1,024) whose client leaves after 0.2 s",
        f"acme's bucket {before} -> {after} tokens within {refill} of refill: "
        f"{before - after + refill} charged",
        "tests/e2e/test_request_lifecycle.py",
    ))  # fmt: skip

    big_tools = [
        {"type": "function", "function": {"name": f"tool_{i}", "parameters": {
            "type": "object",
            "properties": {f"p{k}": {"type": "string", "description": "x" * 60} for k in range(60)},
        }}}
        for i in range(128)
    ]  # fmt: skip
    body = {"model": "llm-small", "messages": HELLO, "max_tokens": 1, "tools": big_tools}
    took, status, answer = timed(lambda: chat(port, body))
    size = len(orjson.dumps(big_tools)) // 1024
    out.append((
        f"{size} KB of tool schemas",
        f"{status} in {took:.3f} s ({error_of(answer)[:110] if status != 200 else 'answered'})",
        "tests/unit/inference/test_schemas.py",
    ))  # fmt: skip

    deep = nested(100)
    for path, payload in (
        ("/v1/chat/completions", {"model": "llm-small", "messages": HELLO, "tools": [
            {"type": "function", "function": {"name": "f", "parameters": deep}}]}),
        ("/v1/responses", {"model": "llm-small", "input": "hi", "tools": [
            {"type": "function", "name": "f", "parameters": deep}]}),
        ("/v1/messages", {"model": "llm-small", "max_tokens": 4, "messages": HELLO,
                          "tools": [{"name": "f", "input_schema": deep}]}),
        ("/v1/messages/count_tokens", {"model": "llm-small", "messages": HELLO,
                                       "tools": [{"name": "f", "input_schema": deep}]}),
    ):  # fmt: skip
        status, _, answer = call(base + path, payload)
        out.append((
            f"tool schema nested 100 levels, `{path}`",
            f"{status}: {error_of(answer)[:100]}",
            "tests/e2e/test_hostile_input.py",
        ))  # fmt: skip

    body = {
        "model": "llm-small", "max_tokens": 4, "messages": HELLO,
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "tool", "name": ["f"]},
    }  # fmt: skip
    status, _, answer = call(base + "/v1/messages", body)
    out.append((
        "`/v1/messages` with `tool_choice.name` a list",
        f"{status}: {error_of(answer)[:80]}",
        "tests/unit/api/test_anthropic.py",
    ))  # fmt: skip

    out.extend(review_rows(port))
    statuses: dict[int, int] = {}
    started = time.monotonic()
    for _ in range(300):
        status, _, _ = call(base + "/v1/responses/resp_none", key=GLOBEX)
        statuses[status] = statuses.get(status, 0) + 1
    took = time.monotonic() - started
    out.append((
        "300 reads of stored responses (globex: 120 requests a minute)",
        f"in {took:.1f} s: " + ", ".join(f"{n} x {s}" for s, n in sorted(statuses.items())),
        "tests/e2e/test_rate_limits.py",
    ))  # fmt: skip

    statuses = {}
    for _ in range(130):
        status, _, _ = call(base + "/v1/messages/count_tokens",
                            {"model": "llm-small", "messages": HELLO}, key=GLOBEX)  # fmt: skip
        statuses[status] = statuses.get(status, 0) + 1
    out.append((
        "130 `count_tokens` calls (globex, its bucket already spent by the reads)",
        ", ".join(f"{n} x {s}" for s, n in sorted(statuses.items())),
        "tests/e2e/test_rate_limits.py",
    ))  # fmt: skip

    socks = []
    for _ in range(4150):
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=2)
        except OSError:
            break
        socks.append(sock)
    time.sleep(0.5)
    request = f"GET /v1/models HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {ACME}\r\n\r\n"
    # From another address of the loopback (the demo listens on 127.0.0.1 alone).
    with socket.create_connection(("127.0.0.1", port), 5, ("127.0.0.2", 0)) as other:
        other.sendall(request.encode())
        other_status = other.recv(4096).split(b"\r\n")[0].decode()
    refused = raw_status(port, request.encode())
    for sock in socks:
        sock.close()
    out.append((
        f"{len(socks)} idle connections from 127.0.0.1, no key; then one more from each of "
        "127.0.0.1 and 127.0.0.2",
        f"127.0.0.1: {refused}; 127.0.0.2: {other_status}",
        "tests/e2e/test_connection_limits.py",
    ))  # fmt: skip
    return out


def review_rows(port: int) -> list[Row]:
    """The attacks the review of the first fixes found (a hostile tenant on a clone)."""
    base = f"http://127.0.0.1:{port}"
    out: list[Row] = []

    url, accepted, close = silent_listener()
    body = {"model": "llm-small", "messages": HELLO,
            "tools": [{"name": "f", "input_schema": {"$schema": url}}]}  # fmt: skip
    (took, status, answer), other = while_running(
        lambda: call(base + "/v1/messages/count_tokens", body, key=GLOBEX), port
    )
    close()
    out.append((
        "tool schema with `$schema` naming a listener that never answers (count_tokens)",
        f"{status} in {took:.2f} s; listener contacted {accepted[0]} times; another "
        f"tenant's request took {other:.2f} s",
        "tests/e2e/test_hostile_input.py",
    ))  # fmt: skip

    links = 29
    defs: dict[str, Any] = {
        f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}] * 2} for i in range(links)
    }
    defs[f"d{links}"] = {"type": "string"}
    chain = {"type": "object", "properties": {"a": {"$ref": "#/$defs/d0"}}, "$defs": defs}
    body = {"model": "llm-small", "messages": HELLO, "max_tokens": 64,
            "response_format": schema_format(chain)}  # fmt: skip
    (took, status, answer), other = while_running(lambda: chat(port, body), port)
    out.append((
        "`response_format` with 29 links of `allOf: [$ref next, $ref next]` (2 KB)",
        f"{status} in {took:.2f} s ({error_of(answer)[60:150]}); another tenant's "
        f"request took {other:.2f} s",
        "tests/unit/inference/test_schemas.py",
    ))  # fmt: skip

    wide = {"type": "object", "properties": {"a": {"type": "string", "anyOf": [
        {"pattern": ".{1,10000}a" + str(i)} for i in range(40)]}}}  # fmt: skip
    body = {"model": "llm-small", "messages": HELLO, "max_tokens": 8,
            "response_format": schema_format(wide)}  # fmt: skip
    took, status, answer = timed(lambda: chat(port, body))
    out.append((
        "`response_format` with 40 patterns `.{1,10000}` (1.2 KB)",
        f"{status} in {took:.3f} s ({error_of(answer)[60:170]})",
        "tests/unit/inference/test_schemas.py",
    ))  # fmt: skip

    once = {"model": "llm-small", "max_tokens": 2, "messages": HELLO}
    statuses: dict[int, int] = {}
    for _ in range(150):
        request = urllib.request.Request(
            base + "/v1/chat/completions", orjson.dumps(once),
            {"Authorization": f"Bearer {GLOBEX}", "Content-Type": "application/json",
             "Idempotency-Key": "replayed-key"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                statuses[response.status] = statuses.get(response.status, 0) + 1
        except urllib.error.HTTPError as error:
            statuses[error.code] = statuses.get(error.code, 0) + 1
    out.append((
        "150 replays of one Idempotency-Key (globex: 120 requests a minute)",
        ", ".join(f"{n} x {s}" for s, n in sorted(statuses.items())),
        "tests/e2e/test_rate_limits.py",
    ))  # fmt: skip

    upgrade = (
        b"GET /v1/chat/completions HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        b"Sec-WebSocket-Version: 13\r\n\r\n"
    )
    for _ in range(130):
        with socket.create_connection(("127.0.0.1", port), 5, ("127.0.0.3", 0)) as sock:
            sock.sendall(upgrade)
            sock.recv(4096)
    request = f"GET /v1/models HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {ACME}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), 5, ("127.0.0.3", 0)) as sock:
        sock.sendall(request.encode())
        after = sock.recv(4096).split(b"\r\n")[0].decode()
    out.append((
        "130 WebSocket upgrade requests without a key, then a keyed request, all from "
        "127.0.0.3",
        f"the keyed request: {after}",
        "tests/e2e/test_connection_limits.py",
    ))  # fmt: skip

    held = []
    for _ in range(1100):
        try:
            sock = socket.create_connection(("127.0.0.1", port), 5, ("127.0.0.6", 0))
            sock.sendall(request.encode())
            if not sock.recv(4096).startswith(b"HTTP/1.1 200"):
                sock.close()
                break
        except OSError:
            break
        held.append(sock)
    with socket.create_connection(("127.0.0.1", port), 5, ("127.0.0.7", 0)) as other_sock:
        other_sock.sendall(request.encode())
        other_status = other_sock.recv(4096).split(b"\r\n")[0].decode()
    for sock in held:
        sock.close()
    out.append((
        "one address opens connections and keeps each alive with a keyed request, then "
        "another address asks",
        f"{len(held)} held before the 429; 127.0.0.7: {other_status}",
        "tests/e2e/test_connection_limits.py",
    ))  # fmt: skip
    return out


def main() -> None:
    port = free_port(span=2, start=27100)
    log = Path(f"/tmp/attacks-untrusted-{port}.log")
    demo = spawn(gateway_command("demo", "--port", str(port), "--ops-port", str(port + 1)), log=log)
    try:
        wait_gateway_ready(f"http://127.0.0.1:{port}", 180, demo)
        table = rows(port)
    finally:
        stop(demo)
    print("| attack | what the tenant gets now | test |\n|---|---|---|")
    for attack, seen, test in table:
        print(f"| {attack} | {seen.replace('|', '/')} | {test} |")


if __name__ == "__main__":
    main()
