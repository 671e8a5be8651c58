"""The demo's API keys, which the README publishes: served only where nobody else reaches.

config/tenants.yaml holds their hashes so that the demo works as the README says; the
image and the dev overlay ship the same file. On a listener other than loopback anyone who
has read the README would be acme, or the admin (`sk-ops-demo` creates keys for any
tenant): `gateway serve` refuses to start so, unless told that this is a demo
(`GATEWAY_DEMO_KEYS=allow`).
"""

from __future__ import annotations

import ipaddress
import os

from gateway.config.keys import digest
from gateway.config.schema import Config

PUBLISHED = ("sk-acme-demo", "sk-globex-demo", "sk-evals-demo", "sk-ops-demo")
ALLOW_ENV = "GATEWAY_DEMO_KEYS"


def published_keys_served(config: Config, hosts: list[str]) -> str | None:
    """Why `config` must not be served on `hosts`, or None: the tenants whose published
    demo keys it accepts, when a host is not loopback and the demo was not allowed."""
    if os.environ.get(ALLOW_ENV) == "allow" or all(_loopback(host) for host in hosts):
        return None
    tenants = sorted(
        {
            config.tenant_by_key_hash[h]
            for h in map(digest, PUBLISHED)
            if h in config.tenant_by_key_hash
        }
    )
    if not tenants:
        return None
    exposed = ", ".join(h for h in hosts if not _loopback(h))
    return (
        f"{config.tenants_path} holds the demo's published API keys (tenants "
        f"{', '.join(tenants)}; README.md), and the gateway would listen on {exposed}: "
        "anyone could use them. Mount a tenants file of your own, or set "
        f"{ALLOW_ENV}=allow for a demo that only you reach."
    )


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything
