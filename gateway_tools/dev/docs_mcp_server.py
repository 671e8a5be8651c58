"""The demo's MCP server: the project's own docs, searched and read, over stdio.

    python3 gateway_tools/dev/docs_mcp_server.py DOCS_DIR

The standard library only (no `mcp` package, nothing installed beyond Python): the demo's
gateway runs it in its sandbox with the system's `python3`, the docs directory and this
file the only paths it sees. Tools: `search_docs` (the lines of every doc that hold all
the words of a query), `read_doc` (one doc, whole, within a cap); each doc is also a
resource, `docs://NAME`. JSON-RPC 2.0, one message a line (MCP's stdio transport).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

PROTOCOL_VERSION = "2025-11-25"
MAX_HITS = 30
MAX_DOC_CHARS = 60_000
TOOLS = [
    {
        "name": "search_docs",
        "title": "Search the gateway's docs",
        "description": "The lines of the gateway's documentation that hold every word of the "
        "query (case-insensitive), with the document and line number of each.",
        "inputSchema": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "Words to find"}},
            "required": ["query"],
        },
        "annotations": {"readOnlyHint": True},
    },
    {
        "name": "read_doc",
        "title": "Read one of the gateway's docs",
        "description": "One document of the gateway's documentation, by name (as search_docs "
        "names it, e.g. mcp.md).",
        "inputSchema": {
            "type": "object",
            "properties": {"name": {"type": "string", "description": "The document's name"}},
            "required": ["name"],
        },
        "annotations": {"readOnlyHint": True},
    },
]


class Docs:
    """The Markdown files of one directory (and its sub-directories)."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    def names(self) -> list[str]:
        return sorted(str(p.relative_to(self.root)) for p in self.root.rglob("*.md"))

    def read(self, name: str) -> str | None:
        path = (self.root / name).resolve()
        if self.root not in path.parents or path.suffix != ".md" or not path.is_file():
            return None
        return path.read_text(errors="replace")

    def search(self, query: str) -> list[str]:
        words = [word.lower() for word in query.split()]
        if not words:
            return []
        hits = []
        for name in self.names():
            text = self.read(name) or ""
            for number, line in enumerate(text.splitlines(), 1):
                lowered = line.lower()
                if all(word in lowered for word in words):
                    hits.append(f"{name}:{number}: {line.strip()[:300]}")
                    if len(hits) >= MAX_HITS:
                        return hits
        return hits


def _text(text: str, error: bool = False) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": error}


def answer(docs: Docs, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """The result of one request; `LookupError` for a method it does not serve."""
    if method == "initialize":
        return {
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {"tools": {}, "resources": {}},
            "serverInfo": {"name": "gateway-docs", "version": "1"},
        }
    if method == "ping":
        return {}
    if method == "tools/list":
        return {"tools": TOOLS}
    if method == "tools/call":
        arguments = params.get("arguments") or {}
        if params.get("name") == "search_docs":
            hits = docs.search(str(arguments.get("query", "")))
            return _text("\n".join(hits) or "nothing found")
        if params.get("name") == "read_doc":
            text = docs.read(str(arguments.get("name", "")))
            if text is None:
                return _text("no such document: " + ", ".join(docs.names()), error=True)
            return _text(text[:MAX_DOC_CHARS])
        raise LookupError(f"unknown tool {params.get('name')!r}")
    if method == "resources/list":
        return {
            "resources": [
                {"uri": f"docs://{name}", "name": name, "mimeType": "text/markdown"}
                for name in docs.names()
            ]
        }
    if method == "resources/read":
        uri = str(params.get("uri", ""))
        text = docs.read(uri.removeprefix("docs://")) if uri.startswith("docs://") else None
        if text is None:
            raise LookupError(f"no resource {uri!r}")
        return {"contents": [{"uri": uri, "mimeType": "text/markdown", "text": text}]}
    raise LookupError(f"method not found: {method}")


def serve(docs: Docs) -> None:
    for line in sys.stdin:
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if not isinstance(message, dict) or "id" not in message or "method" not in message:
            continue  # a notification or a response: nothing to answer
        given = message.get("params")
        params: dict[str, Any] = given if isinstance(given, dict) else {}
        try:
            reply = {"result": answer(docs, str(message["method"]), params)}
        except LookupError as missing:
            reply = {"error": {"code": -32601, "message": str(missing)}}
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], **reply}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: docs_mcp_server.py DOCS_DIR")
    serve(Docs(Path(sys.argv[1])))
