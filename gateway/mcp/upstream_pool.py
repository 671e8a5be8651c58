"""This process's connections to the upstream MCP servers: one per (tenant, server),
opened on first use and closed when idle, so that one tenant's calls never share a
process (or an upstream session) with another's. Their listings are kept until the
server says they changed (`notifications/*/list_changed`) or `LISTING_TTL_S` passes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.config.schema import McpServer
from gateway.mcp.jsonrpc import METHOD_NOT_FOUND
from gateway.mcp.upstream_connections import Connection, open_connection
from gateway.mcp.upstream_peer import UpstreamFailure

log = logging.getLogger("gateway.mcp")

# What a server lists is asked again after this long, told of a change or not.
LISTING_TTL_S = 300.0
# A server that failed to start is not tried again for this long: its callers are told
# at once rather than each waiting for its start to fail.
RETRY_AFTER_S = 5.0
# A (tenant, server)'s connection is opened at most this often: a tenant that has its
# process killed on every call (a result past the cap) waits, rather than the host
# starting processes without end.
REOPEN_EVERY_S = 1.0
# Pages of one listing followed at most.
MAX_PAGES = 20
# The listings, by the method that lists them and the field that holds them.
LISTS = {
    "tools": ("tools/list", "tools"),
    "resources": ("resources/list", "resources"),
    "resource_templates": ("resources/templates/list", "resourceTemplates"),
    "prompts": ("prompts/list", "prompts"),
}
# The capability a server declares when it has such a listing.
CAPABILITIES = {
    "tools": "tools",
    "resources": "resources",
    "resource_templates": "resources",
    "prompts": "prompts",
}
# A list-changed notification's method, and the listings it makes stale.
CHANGES = {
    "notifications/tools/list_changed": ("tools",),
    "notifications/resources/list_changed": ("resources", "resource_templates"),
    "notifications/prompts/list_changed": ("prompts",),
}
# Told of a change of a tenant's server's listing: (tenant, server, kind).
ChangeSink = Callable[[str, str, str], None]


@dataclass(slots=True)
class _Slot:
    """One (tenant, server)'s connection, or its opening, and its listings."""

    opening: asyncio.Task[Connection] | None = None
    connection: Connection | None = None
    used: float = field(default_factory=time.monotonic)
    failed: UpstreamFailure | None = None
    failed_at: float = 0.0
    opened_at: float = -REOPEN_EVERY_S
    listings: dict[str, tuple[float, list[dict[str, Any]]]] = field(default_factory=dict)
    # Changes told (kind -> when), coalesced to one a second.
    told: dict[str, float] = field(default_factory=dict)


class UpstreamPool:
    """Connections by (tenant, server), and what each server lists."""

    def __init__(
        self, servers: Mapping[str, McpServer], on_change: ChangeSink, max_items: int
    ) -> None:
        self._servers = servers
        self._on_change = on_change
        self._max_items = max_items
        self._slots: dict[tuple[str, str], _Slot] = {}
        self._sweeper: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Idle connections closed from now on."""
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    def server(self, name: str) -> McpServer | None:
        return self._servers.get(name)

    async def call(
        self, tenant: str, server: str, method: str, params: dict[str, Any], timeout_s: float
    ) -> dict[str, Any]:
        """`method`'s result from `server` on `tenant`'s connection (opened if need be;
        opened again once if it had closed)."""
        connection = await self._connection(tenant, server)
        return await connection.call(method, params, timeout_s)

    async def listing(self, tenant: str, server: str, kind: str) -> list[dict[str, Any]]:
        """What `server` lists of `kind` (`tools`, `resources`, `resource_templates`,
        `prompts`) on `tenant`'s connection; each page followed, at most `max_items`."""
        slot = self._slot(tenant, server)
        kept = slot.listings.get(kind)
        if kept is not None and time.monotonic() - kept[0] < LISTING_TTL_S:
            return kept[1]
        config = self._servers[server]
        method, member = LISTS[kind]
        connection = await self._connection(tenant, server)
        offered = connection.initialize_result.get("capabilities")
        if not isinstance(offered, dict) or CAPABILITIES[kind] not in offered:
            return []  # the server offers none: not asked
        items: list[dict[str, Any]] = []
        cursor: str | None = None
        asked = time.monotonic()
        for _ in range(MAX_PAGES):
            params = {} if cursor is None else {"cursor": cursor}
            try:
                result = await self.call(tenant, server, method, params, config.timeout_s)
            except UpstreamFailure as failure:
                if failure.outcome != "error" or failure.code != METHOD_NOT_FOUND:
                    raise
                break  # it offers none of these (resource templates, say): an empty list
            page = result.get(member)
            if isinstance(page, list):
                items += [item for item in page if isinstance(item, dict)]
            next_cursor = result.get("nextCursor")
            if not isinstance(next_cursor, str) or not next_cursor or len(items) >= self._max_items:
                break
            cursor = next_cursor
        if len(items) > self._max_items:
            log.warning(
                "MCP server %s lists over %d %s: the rest left out", server, self._max_items, kind
            )
            items = items[: self._max_items]
        slot.listings[kind] = (asked, items)
        return items

    def _slot(self, tenant: str, server: str) -> _Slot:
        slot = self._slots.get((tenant, server))
        if slot is None:
            slot = self._slots[(tenant, server)] = _Slot()
        return slot

    async def _connection(self, tenant: str, server: str) -> Connection:
        slot = self._slot(tenant, server)
        slot.used = time.monotonic()
        if slot.connection is not None and not slot.connection.closed:
            return slot.connection
        if slot.failed is not None and time.monotonic() - slot.failed_at < RETRY_AFTER_S:
            raise slot.failed
        if slot.opening is None:
            if slot.connection is not None:
                closed, slot.connection = slot.connection, None
                slot.listings.clear()
                asyncio.get_running_loop().create_task(closed.close())
            slot.opening = asyncio.get_running_loop().create_task(self._open(tenant, server))
        opening = slot.opening
        # One caller's leaving must not cancel the opening others wait for.
        return await asyncio.shield(opening)

    async def _open(self, tenant: str, server: str) -> Connection:
        slot = self._slot(tenant, server)
        wait = slot.opened_at + REOPEN_EVERY_S - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        slot.opened_at = time.monotonic()

        def notified(method: str, params: dict[str, Any]) -> None:
            self._notified(tenant, server, method)

        try:
            connection = await open_connection(server, self._servers[server], notified, tenant)
        except UpstreamFailure as failure:
            slot.failed, slot.failed_at = failure, time.monotonic()
            raise
        finally:
            slot.opening = None
        slot.failed = None
        slot.connection = connection
        return connection

    def _notified(self, tenant: str, server: str, method: str) -> None:
        kinds = CHANGES.get(method)
        if kinds is None:
            return  # progress, log messages, resource updates: not relayed
        slot = self._slot(tenant, server)
        now = time.monotonic()
        for kind in kinds:
            slot.listings.pop(kind, None)
            if now - slot.told.get(kind, 0.0) >= 1.0:
                slot.told[kind] = now
                self._on_change(tenant, server, kind)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(5.0)
            now = time.monotonic()
            for key, slot in list(self._slots.items()):
                idle = self._servers.get(key[1])
                limit = 0.0 if idle is None else idle.idle_timeout_s
                if slot.opening is None and now - slot.used >= limit:
                    del self._slots[key]
                    if slot.connection is not None:
                        with contextlib.suppress(Exception):
                            await slot.connection.close()

    async def close(self) -> None:
        """Every connection closed (every stdio server ended)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        slots, self._slots = list(self._slots.values()), {}
        for slot in slots:
            if slot.opening is not None:
                slot.opening.cancel()
        await asyncio.gather(
            *(s.connection.close() for s in slots if s.connection is not None),
            *(s.opening for s in slots if s.opening is not None),
            return_exceptions=True,
        )
