"""Normal traffic while a hostile client holds half-open connections (issue 12).

    .venv/bin/python -m loadtest.halfopen [--connections 1000] [--seconds 10]

Starts the benchmark stack (loadtest/stack.py: nginx, redis-server, the gateway with
loadtest/bench-config at its default connection limits), measures chat completions with
wrk at concurrency 1 and 32, then opens `--connections` connections that each send half
a request head and stop, measures again while they are held (4 s each, within the
gateway's head deadline), and reports how long the
gateway took to close them all (its `server.head_timeout_s`, 10 s by default).
"""

from __future__ import annotations

import argparse
import selectors
import socket
import time

from loadtest.stack import bench_stack, wrk, wrk_script

HALF_HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: appl"


# The hostile client's own address: wrk's connections come from 127.0.0.1, and the
# gateway caps each address's connections that have not had a key accepted
# (`server.max_slow_connections_per_address`), so they must not share one.
HOSTILE_ADDRESS = "127.0.0.2"


def open_half(host: str, port: int, count: int) -> list[socket.socket]:
    """`count` connections from HOSTILE_ADDRESS, each stopped in the middle of its
    request head (those over the gateway's per-address cap are refused at once)."""
    held = []
    for _ in range(count):
        sock = socket.create_connection((host, port), source_address=(HOSTILE_ADDRESS, 0))
        sock.sendall(HALF_HEAD)
        held.append(sock)
    return held


def seconds_until_closed(held: list[socket.socket], since: float, limit_s: float) -> float:
    """Seconds from `since` until the gateway has closed every held connection."""
    selector = selectors.DefaultSelector()
    for sock in held:
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
    open_ = len(held)
    while open_ and time.monotonic() - since < limit_s:
        for key, _ in selector.select(timeout=0.5):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                data = sock.recv(65536)
            except ConnectionError:
                data = b""
            if not data:  # closed (after its 408, read as data first)
                selector.unregister(sock)
                open_ -= 1
    for sock in held:
        sock.close()
    if open_:
        raise RuntimeError(f"{open_} connections still open after {limit_s} s")
    return time.monotonic() - since


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--seconds", type=int, default=10)
    args = parser.parse_args()
    script = wrk_script()
    with bench_stack() as stack:
        host, port = stack.gateway_url.removeprefix("http://").split(":")
        wrk(stack.chat_url, 8, 2, script)  # warm up
        rows = [("none held", c, wrk(stack.chat_url, c, args.seconds, script)) for c in (1, 32)]
        opened = time.monotonic()
        held = open_half(host, int(port), args.connections)
        label = f"{args.connections} half-open held"
        # Both runs end before the gateway's head deadline (10 s) closes the held ones.
        during = min(args.seconds, 4)
        rows += [(label, c, wrk(stack.chat_url, c, during, script)) for c in (1, 32)]
        closed_after = seconds_until_closed(held, opened, limit_s=120)
    print("| half-open connections | concurrency | requests/s | p50 ms | p99 ms |")
    print("|---|---|---|---|---|")
    for label, connections, result in rows:
        print(
            f"| {label} | {connections} | {result['rps']:.0f} | {result['p50']:.2f} "
            f"| {result['p99']:.2f} |"
        )
    print(
        f"\nThe gateway closed all {args.connections} half-open connections "
        f"{closed_after:.1f} s after they were opened."
    )


if __name__ == "__main__":
    main()
