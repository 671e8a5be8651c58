"""The PROXY protocol header as load balancers send it, and as an attacker might."""

from __future__ import annotations

import socket
import struct

import pytest

from gateway.transport.proxy_protocol import ProxyHeader, ProxyHeaderError, parse

V2 = b"\r\n\r\n\x00\r\nQUIT\n"


def v2(command: int, family: int, addresses: bytes) -> bytes:
    return V2 + bytes([0x20 | command, family]) + struct.pack("!H", len(addresses)) + addresses


@pytest.mark.parametrize(
    ("data", "header"),
    [
        (
            b"PROXY TCP4 203.0.113.5 10.0.0.1 40000 8080\r\nGET",
            ProxyHeader(("203.0.113.5", 40000), 44),
        ),
        (b"PROXY TCP6 2001:db8::1 2001:db8::2 1 2\r\n", ProxyHeader(("2001:db8::1", 1), 40)),
        (b"PROXY UNKNOWN\r\n", ProxyHeader(None, 15)),
        (
            v2(1, 0x11, socket.inet_aton("198.51.100.9") + bytes(4) + struct.pack("!HH", 5000, 80)),
            ProxyHeader(("198.51.100.9", 5000), 28),
        ),
        (
            v2(1, 0x21, socket.inet_pton(socket.AF_INET6, "2001:db8::7") + bytes(16) + bytes(4)),
            ProxyHeader(("2001:db8::7", 0), 52),
        ),
        (v2(0, 0x11, bytes(12)), ProxyHeader(None, 28)),  # LOCAL: the balancer's health check
    ],
)
def test_a_header_names_the_client_and_its_length(data: bytes, header: ProxyHeader) -> None:
    assert parse(data) == header


@pytest.mark.parametrize("data", [b"", b"PRO", b"PROXY TCP4 1.2.3.4", V2[:5], V2 + b"\x21\x11\x00"])
def test_a_header_in_pieces_waits_for_more(data: bytes) -> None:
    assert parse(data) is None


@pytest.mark.parametrize(
    "data",
    [
        b"GET / HTTP/1.1\r\n",
        b"PROXY TCP4 " + b"1" * 200,  # no end within v1's 107 bytes
        b"PROXY TCP4 999.1.1.1 10.0.0.1 1 2\r\n",
        b"PROXY TCP4 2001:db8::1 10.0.0.1 1 2\r\n",  # an IPv6 address said to be TCP4
        b"PROXY TCP4 1.2.3.4 10.0.0.1 99999 2\r\n",
        b"PROXY TCP4 1.2.3.4\r\n",
        b"PROXY TCP4 1.2.3.4 10.0.0.1 +1_0 2\r\n",  # int() reads it; the specification not
        b"PROXY TCP6 fe80::1%eth0 ::1 1 80\r\n",  # a zone is no client's address
        b"PROXY TCP4 \xff\xfe 1 2 3\r\n",
        V2 + b"\x31\x11\x00\x0c" + bytes(12),  # version 3
        V2 + b"\x21\x11\xff\xff",  # 64 KiB of header announced
        v2(1, 0x31, bytes(216)),  # a Unix socket family
    ],
)
def test_anything_else_is_refused(data: bytes) -> None:
    with pytest.raises(ProxyHeaderError):
        parse(data)
