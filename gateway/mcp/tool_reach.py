"""Which upstream servers and tools a caller may see and call: its tenant's `mcp.tools`
patterns (tenants.yaml), narrowed by its managed key's own (`gateway keys --mcp`)."""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase


def _split(pattern: str) -> tuple[str, str]:
    """A pattern's server and tool parts: `github` and `*` mean every tool of theirs."""
    server, _, tool = pattern.partition("/")
    return server, tool or "*"


def _matches(patterns: tuple[str, ...], server: str, tool: str | None) -> bool:
    for pattern in patterns:
        server_part, tool_part = _split(pattern)
        if fnmatchcase(server, server_part) and (tool is None or fnmatchcase(tool, tool_part)):
            return True
    return False


@dataclass(frozen=True, slots=True)
class McpAccess:
    """A caller's reach: the tenant's patterns and, for a managed key with its own, the
    key's (None: the tenant's alone)."""

    tenant_patterns: tuple[str, ...]
    key_patterns: tuple[str, ...] | None = None

    def sees_server(self, server: str) -> bool:
        """Whether any tool of `server` may be allowed."""
        return _matches(self.tenant_patterns, server, None) and (
            self.key_patterns is None or _matches(self.key_patterns, server, None)
        )

    def allows(self, server: str, tool: str) -> bool:
        """Whether `server`'s tool (or prompt, or resource: `tool` its name) may be
        listed and called."""
        return _matches(self.tenant_patterns, server, tool) and (
            self.key_patterns is None or _matches(self.key_patterns, server, tool)
        )
