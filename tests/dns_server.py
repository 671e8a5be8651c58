"""An authoritative DNS server of the tests' own (dnslib's DNSServer), whose records a
test changes while the gateway runs: A records by name, SRV records by name."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from dnslib import QTYPE, RCODE, RR, SRV, A, DNSRecord
from dnslib.server import BaseResolver, DNSServer

from gateway_tools.dev.processes import free_port
from tests import ports


@dataclass
class Zone:
    """The records served now; replace them with `set_a` and `set_srv` at any time."""

    a: dict[str, list[str]] = field(default_factory=dict)
    srv: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def set_a(self, name: str, addresses: list[str]) -> None:
        with self.lock:
            self.a[name.rstrip(".")] = list(addresses)

    def set_srv(self, name: str, targets: list[tuple[str, int]]) -> None:
        with self.lock:
            self.srv[name.rstrip(".")] = list(targets)


class _Resolver(BaseResolver):  # type: ignore[misc]
    def __init__(self, zone: Zone) -> None:
        self.zone = zone

    def resolve(self, request: DNSRecord, handler: Any) -> DNSRecord:
        reply = request.reply()
        name = str(request.q.qname).rstrip(".")
        kind = QTYPE[request.q.qtype]
        with self.zone.lock:
            if kind == "A" and self.zone.a.get(name):
                for address in self.zone.a[name]:
                    reply.add_answer(RR(name, QTYPE.A, rdata=A(address), ttl=1))
            elif kind == "SRV" and self.zone.srv.get(name):
                for target, port in self.zone.srv[name]:
                    reply.add_answer(RR(name, QTYPE.SRV, rdata=SRV(0, 100, port, target), ttl=1))
            else:
                reply.header.rcode = RCODE.NXDOMAIN
        return reply


@contextmanager
def dns_server() -> Iterator[tuple[str, Zone]]:
    """`host:port` of a running server (UDP and TCP) and the zone it serves."""
    zone = Zone()
    port = free_port(start=ports.DNS_SERVERS, end=ports.DNS_SERVERS + 500)
    servers = [
        DNSServer(_Resolver(zone), port=port, address="127.0.0.1", tcp=tcp) for tcp in (False, True)
    ]
    for server in servers:
        server.start_thread()
    try:
        yield f"127.0.0.1:{port}", zone
    finally:
        for server in servers:
            server.stop()
