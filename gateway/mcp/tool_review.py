"""Rug pulls and poisoned descriptions: a tool is pinned by the hash of what it tells the
model (its title, description, input schema and annotations) the first time any gateway
lists it; a listing with another hash is a change, and a description that reads as
instructions to the model (a hidden `<IMPORTANT>` block, "ignore previous instructions",
"do not tell the user", a path to keys) is suspect from the start. Either is flagged (a
log line, a metric) and, with `mcp.on_tool_change: hide`, kept from clients until an
operator accepts it (`gateway mcp accept`, `POST /admin/mcp/tools/accept`).

The pins are in Redis, shared by every gateway: the first listing anywhere pins a tool
(HSETNX), and an acceptance anywhere is seen everywhere on the next listing.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.observability import metrics
from gateway.storage.redis_client import RedisClient

log = logging.getLogger("gateway.mcp")
audit = logging.getLogger("gateway.audit")

# Phrases of tool-poisoning attacks: instructions to the model hidden in what a tool says
# of itself. A description that has one waits for an operator, as a changed one does.
_INSTRUCTIONS = re.compile(
    r"<\s*/?\s*(important|system|instructions?|secret)\s*>"
    r"|ignore\s+(all\s+|any\s+)?(previous|prior|above|earlier)\s+(instructions|prompts?|messages)"
    r"|do\s+not\s+(tell|mention|inform|reveal\s+to)\s+the\s+user"
    r"|(without|before)\s+(telling|informing)\s+the\s+user"
    r"|~/\.ssh|id_rsa|\.aws/credentials|/etc/passwd|\.env\b",
    re.IGNORECASE,
)
# What an operator is shown of a held tool's description.
SHOWN_CHARS = 2000
# Tools held at once, of every server: past it, a tool is hidden (with `hide`) but not
# recorded, so that a server renaming its tools on every listing cannot grow Redis.
MAX_HELD = 1000


def _name(tool: dict[str, Any]) -> str:
    name = tool.get("name")
    return name if isinstance(name, str) else ""


def fingerprint(tool: dict[str, Any]) -> str:
    """The hash of what a tool tells the model of itself."""
    parts = ("title", "description", "inputSchema", "outputSchema", "annotations", "icons")
    told = {part: tool.get(part) for part in parts}
    return hashlib.sha256(orjson.dumps(told, option=orjson.OPT_SORT_KEYS)).hexdigest()


def suspicion(tool: dict[str, Any], max_chars: int) -> str | None:
    """Why a tool's own words are suspect, or None: its title or description over
    `max_chars`, or instructions to the model in them or in any string of its input
    schema (its keys too: a property may be named as a sentence)."""
    told = [tool.get("description"), tool.get("title")]
    for text in told:
        if isinstance(text, str) and len(text) > max_chars:
            return f"its description is over {max_chars} characters"
    schemas = [*_strings(tool.get("inputSchema")), *_strings(tool.get("outputSchema"))]
    for text in [*told, *schemas]:
        found = _INSTRUCTIONS.search(text) if isinstance(text, str) else None
        if found is not None:
            return f"its description reads as instructions to the model ({found.group(0)[:60]!r})"
    return None


def _strings(value: Any) -> list[str]:
    """Every string of a JSON value, keys included, level by level (no recursion: a
    server's schema may nest as deep as its JSON allows)."""
    found: list[str] = []
    level = [value]
    while level:
        deeper: list[Any] = []
        for node in level:
            if isinstance(node, str):
                found.append(node)
            elif isinstance(node, dict):
                found += [key for key in node if isinstance(key, str)]
                deeper += node.values()
            elif isinstance(node, list):
                deeper += node
        level = deeper
    return found


@dataclass(frozen=True, slots=True)
class HeldTool:
    """A tool kept from clients until accepted: why, and what it says now."""

    server: str
    tool: str
    reason: str
    fingerprint: str
    description: str
    seen: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "tool": self.tool,
            "reason": self.reason,
            "fingerprint": self.fingerprint,
            "description": self.description,
            "seen": self.seen,
        }


class ToolReview:
    """The pins and the held tools in Redis, and each verdict remembered here by its
    fingerprint once allowed (a listing costs Redis one round trip per server, none once
    its tools are known)."""

    def __init__(self, redis: RedisClient, prefix: str, max_chars: int, hide: bool) -> None:
        self._redis = redis
        self._pins = f"{prefix}:mcp:pins"
        self._held = f"{prefix}:mcp:held"
        self._max_chars = max_chars
        self.hide = hide
        # (server, tool, fingerprint) of the tools known to be as pinned: allowed. A held
        # one is not remembered: an acceptance on another gateway is seen on its next
        # listing.
        self._pinned: set[tuple[str, str, str]] = set()

    async def allowed(self, server: str, tools: list[dict[str, Any]]) -> list[bool]:
        """For each of `server`'s tools, whether clients may see it now."""
        prints = [fingerprint(tool) for tool in tools]
        names = [_name(tool) for tool in tools]
        keys = [(server, n, mark) for n, mark in zip(names, prints, strict=True)]
        verdicts = [key in self._pinned for key in keys]
        unknown = [i for i, known in enumerate(verdicts) if not known]
        if unknown:
            fields = [f"{server}/{names[i]}" for i in unknown]
            pinned = await self._redis.hmget(self._pins, fields)
            if len(self._pinned) > 100_000:
                self._pinned.clear()
            for i, pin in zip(unknown, pinned, strict=True):
                verdicts[i] = await self._judge(server, names[i], tools[i], prints[i], pin)
                if verdicts[i]:
                    self._pinned.add(keys[i])
        return [verdict or not self.hide for verdict in verdicts]

    async def _judge(
        self, server: str, name: str, tool: dict[str, Any], mark: str, pin: bytes | str | None
    ) -> bool:
        field = f"{server}/{name}"
        pinned = pin.decode() if isinstance(pin, bytes) else pin
        if pinned == mark:
            # As pinned: a change held before and reverted since is held no more.
            await self._redis.hdel(self._held, field)
            return True
        reason = None
        if pinned is None:
            reason = suspicion(tool, self._max_chars)
            if reason is None and await self._redis.hsetnx(self._pins, field, mark):
                return True
            if reason is None:  # another gateway pinned it a moment ago: look again
                again = await self._redis.hget(self._pins, field)
                if (again.decode() if isinstance(again, bytes) else again) == mark:
                    return True
        reason = reason or "its description or schema changed since it was first listed"
        await self._hold(server, name, tool, mark, reason)
        return False

    async def _hold(
        self, server: str, name: str, tool: dict[str, Any], mark: str, reason: str
    ) -> None:
        field = f"{server}/{name}"
        known = await self._redis.hget(self._held, field)
        if known is not None and orjson.loads(known).get("fingerprint") == mark:
            return  # held already, as it is now
        if known is None and await self._redis.hlen(self._held) >= MAX_HELD:
            log.warning("MCP tool %s not recorded as held: %d are held already", field, MAX_HELD)
            return
        description = tool.get("description")
        held = HeldTool(
            server,
            name,
            reason,
            mark,
            description[:SHOWN_CHARS] if isinstance(description, str) else "",
            time.time(),
        )
        await self._redis.hset(self._held, field, orjson.dumps(held.as_dict()))
        metrics.MCP_TOOLS_HELD.labels(server).inc()
        audit.warning(
            "MCP tool %s/%s %s: %s",
            server,
            name,
            "hidden until accepted" if self.hide else "flagged",
            reason,
            extra={"fields": {"server": server, "tool": name, "fingerprint": mark}},
        )

    async def held(self) -> list[HeldTool]:
        """The tools waiting for an operator, by server and name."""
        found = await self._redis.hgetall(self._held)
        tools = []
        for value in found.values():
            data = orjson.loads(value)
            tools.append(HeldTool(**data))
        return sorted(tools, key=lambda t: (t.server, t.tool))

    async def accept(self, server: str, tool: str) -> HeldTool | None:
        """Pin a held tool as it is now (None: no such tool is held)."""
        field = f"{server}/{tool}"
        value = await self._redis.hget(self._held, field)
        if value is None:
            return None
        held = HeldTool(**orjson.loads(value))
        await self._redis.hset(self._pins, field, held.fingerprint)
        await self._redis.hdel(self._held, field)
        self._pinned.clear()
        audit.info(
            "MCP tool %s accepted", field, extra={"fields": {"fingerprint": held.fingerprint}}
        )
        return held
