"""The PROXY protocol header (v1 text, v2 binary) that an L4 load balancer sends first.

HAProxy's specification (proxy-protocol.txt): v1 is one line of at most 107 bytes,
`PROXY TCP4 <src> <dst> <sport> <dport>\\r\\n` (TCP6 likewise, or `PROXY UNKNOWN ...`);
v2 is a 12-byte signature, a version and command byte, a family byte, a 2-byte length
and the addresses, then TLVs we skip. A LOCAL command (v2) or UNKNOWN family (v1) is the
balancer's own connection, a health check: the peer's address stands.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

_V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
_V1_PREFIX = b"PROXY "
_V1_MAX = 107
# A v2 header's TLVs are the balancer's; beyond this it is not a header we accept.
_V2_MAX = 16 + 2048


class ProxyHeaderError(ValueError):
    """The connection did not start with a PROXY protocol header we can read."""


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    """What the header said: the client's address (None: the peer's stands) and how many
    bytes of the stream it took."""

    client: tuple[str, int] | None
    length: int


def parse(data: bytes) -> ProxyHeader | None:
    """The header at the start of `data`; None while more bytes are needed to tell."""
    if data.startswith(_V2_SIGNATURE[: len(data)]) and len(data) < len(_V2_SIGNATURE):
        return None
    if data.startswith(_V2_SIGNATURE):
        return _parse_v2(data)
    if _V1_PREFIX.startswith(data[: len(_V1_PREFIX)]) and len(data) < len(_V1_PREFIX):
        return None
    if data.startswith(_V1_PREFIX):
        return _parse_v1(data)
    raise ProxyHeaderError("no PROXY protocol header")


def _parse_v1(data: bytes) -> ProxyHeader | None:
    end = data.find(b"\r\n", 0, _V1_MAX)
    if end < 0:
        if len(data) >= _V1_MAX:
            raise ProxyHeaderError("a PROXY v1 line longer than 107 bytes")
        return None
    parts = data[:end].split(b" ")
    if len(parts) >= 2 and parts[1] == b"UNKNOWN":
        return ProxyHeader(None, end + 2)
    if len(parts) != 6 or parts[1] not in (b"TCP4", b"TCP6"):
        raise ProxyHeaderError("a malformed PROXY v1 line")
    try:
        source = ipaddress.ip_address(parts[2].decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise ProxyHeaderError("a malformed PROXY v1 address") from None
    # Ports as the specification writes them: 1 to 5 digits (int() also takes `+1_0`).
    port = int(parts[4]) if parts[4].isdigit() and len(parts[4]) <= 5 else -1
    wrong_family = source.version != (4 if parts[1] == b"TCP4" else 6)
    if wrong_family or "%" in str(source) or not 0 <= port <= 65535:
        raise ProxyHeaderError("a malformed PROXY v1 address")
    return ProxyHeader((str(source), port), end + 2)


def _parse_v2(data: bytes) -> ProxyHeader | None:
    if len(data) < 16:
        return None
    version_command, family, length = struct.unpack_from("!BBH", data, 12)
    if version_command >> 4 != 2 or version_command & 0xF > 1:
        raise ProxyHeaderError("a PROXY v2 header of an unknown version or command")
    if 16 + length > _V2_MAX:
        raise ProxyHeaderError("a PROXY v2 header longer than the gateway reads")
    if len(data) < 16 + length:
        return None
    total = 16 + length
    if version_command & 0xF == 0:  # LOCAL: the balancer's own connection
        return ProxyHeader(None, total)
    if family == 0x11 and length >= 12:  # TCP over IPv4
        (port,) = struct.unpack_from("!H", data, 24)
        return ProxyHeader((str(ipaddress.IPv4Address(data[16:20])), port), total)
    if family == 0x21 and length >= 36:  # TCP over IPv6
        (port,) = struct.unpack_from("!H", data, 48)
        return ProxyHeader((str(ipaddress.IPv6Address(data[16:32])), port), total)
    if family == 0x00:  # UNSPEC: as LOCAL
        return ProxyHeader(None, total)
    raise ProxyHeaderError("a PROXY v2 header of an address family the gateway does not serve")
