"""A local listener that accepts connections and never answers: what a hostile tenant
points a schema at, to see whether the gateway fetches it (and waits)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def silent_listener(path: str = "/schema.json") -> Iterator[tuple[str, list[bytes]]]:
    """(a URL on 127.0.0.1 that never answers, the first bytes of each connection made
    to it). Each connection is kept open, as a slow server would."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)
    accepted: list[bytes] = []
    held: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                connection, _ = server.accept()
            except TimeoutError:
                continue
            held.append(connection)
            connection.settimeout(1.0)
            try:
                accepted.append(connection.recv(4096))
            except OSError:
                accepted.append(b"")

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}{path}", accepted
    finally:
        done.set()
        thread.join()
        for connection in held:
            connection.close()
        server.close()
