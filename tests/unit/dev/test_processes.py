"""Local processes for the demo and the tests: free ports, and waits that Ctrl-C can stop."""

from __future__ import annotations

import socket
import subprocess
import threading

import pytest

from gateway_tools.dev.processes import (
    Cancelled,
    ephemeral_ports,
    free_port,
    port_is_free,
    wait_http_ok,
    wait_listening,
)


def test_free_port_never_picks_an_ephemeral_port() -> None:
    ephemeral = ephemeral_ports()
    port = free_port(start=ephemeral.start - 50, end=ephemeral.start + 2000)
    assert port < ephemeral.start
    assert port_is_free(port)


def test_free_port_skips_a_port_that_is_taken() -> None:
    start = free_port(start=12000, end=12100)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", start))
        holder.listen()
        assert free_port(start=start, end=start + 2) == start + 1


# --- waits that a stop request ends ------------------------------------------------


def _set_soon(event: threading.Event, delay_s: float = 0.2) -> None:
    threading.Timer(delay_s, event.set).start()


def test_wait_http_ok_gives_up_when_cancelled() -> None:
    cancel = threading.Event()
    _set_soon(cancel)
    # Cancelled, not the TimeoutError its 60 s would end in: the cancel ended the wait.
    with pytest.raises(Cancelled):
        wait_http_ok(f"http://127.0.0.1:{free_port()}/", timeout_s=60, cancel=cancel)


def test_wait_listening_stops_the_process_when_cancelled() -> None:
    process = subprocess.Popen(["sleep", "30"], start_new_session=True)
    cancel = threading.Event()
    _set_soon(cancel)
    with pytest.raises(Cancelled):
        wait_listening(process, free_port(), "sleep", timeout_s=60, cancel=cancel)
    assert process.poll() is not None
