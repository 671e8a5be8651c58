"""A well-behaved MCP server (the `mcp` SDK's `MCPServer`): a few tools, a resource and a
prompt, over stdio (the default) or Streamable HTTP (`--http PORT`).

`look` tries what a sandboxed server must not manage (read a host file, reach the
network) and says what it found; `open_fds` lists the descriptors it holds; `write_note`
and `read_note` keep notes in NOTES_DIR (its tenant's own, `{tenant}`); `secret_env`
says whether its environment holds what the gateway gave it; `echo` and `add` are what
clients call."""

from __future__ import annotations

import os
import socket
import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("notes", instructions="Notes for tests.")


@server.tool(description="Echo the text back.")
def echo(text: str) -> str:
    return text


@server.tool(description="Add two integers.")
def add(a: int, b: int) -> int:
    return a + b


@server.tool(description="What this process can see of the host.")
def look(path: str = "/etc/hostname", host: str = "127.0.0.1", port: int = 6379) -> str:
    try:
        with open(path, "rb") as file:
            read = f"read {len(file.read())} bytes of {path}"
    except OSError as error:
        read = f"cannot read {path}: {type(error).__name__}"
    try:
        with socket.create_connection((host, port), timeout=2):
            reached = f"reached {host}:{port}"
    except OSError as error:
        reached = f"cannot reach {host}:{port}: {type(error).__name__}"
    return f"{read}; {reached}; uid {os.getuid()}"


@server.tool(description="Whether the environment variable is set, and its length.")
def secret_env(name: str) -> str:
    value = os.environ.get(name)
    return "unset" if value is None else f"set, {len(value)} characters"


@server.tool(description="The file descriptors this process holds, and what each is.")
def open_fds() -> str:
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            found.append(f"{name}:{os.readlink(f'/proc/self/fd/{name}')}")
        except OSError:
            continue  # the listing's own, closed by now
    return " ".join(sorted(found))


@server.tool(description="Keep a note under a name (in the directory NOTES_DIR names).")
def write_note(name: str, text: str) -> str:
    with open(os.path.join(os.environ["NOTES_DIR"], os.path.basename(name)), "w") as file:
        file.write(text)
    return "kept"


@server.tool(description="A note kept under a name, or that there is none.")
def read_note(name: str) -> str:
    try:
        with open(os.path.join(os.environ["NOTES_DIR"], os.path.basename(name))) as file:
            return file.read()
    except OSError:
        return "no such note"


@server.resource("notes://today", description="Today's note.")
def today() -> str:
    return "buy milk"


@server.prompt(description="A greeting.")
def greet(name: str) -> str:
    return f"Say hello to {name}."


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
