"""Free ports for the demo and the tests stay clear of the kernel's ephemeral range."""

from __future__ import annotations

import socket

from gateway.devstack import ephemeral_ports, free_port, port_is_free


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
