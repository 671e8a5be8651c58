#!/usr/bin/env bash
# Installs the MCP servers and the MCP Inspector the tests run (from the npm registry,
# pinned) into a cache shared between runs, one directory per package and version, and
# prints the directory that holds them, one sub-directory per package:
#
#   scripts/mcp-tools.sh        ->  <dir>/server-everything, <dir>/server-filesystem,
#                                   <dir>/inspector (each an npm prefix)
#
# Raise a version here when they move: the tests then run the new one
# (tests/e2e/mcp/test_mcp_clients.py).
set -euo pipefail

declare -A PINS=(
  [server-everything]="@modelcontextprotocol/server-everything@2026.8.31"
  [server-filesystem]="@modelcontextprotocol/server-filesystem@2026.8.31"
  [inspector]="@modelcontextprotocol/inspector@2.12.0"
)
command -v npm >/dev/null || { echo "mcp-tools: npm is needed (apt-get install npm)" >&2; exit 1; }
cache=${GATEWAY_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gateway-coding-tools}
out="$cache/mcp-$(printf '%s\n' "${PINS[@]}" | sort | sha256sum | cut -c1-12)"
mkdir -p "$cache" "$out"
# One install at a time (the coding tools' script takes the same lock).
exec 9>"$cache/.lock"
flock 9
for name in "${!PINS[@]}"; do
  pin=${PINS[$name]}
  dir="$cache/$name-$(printf '%s' "$pin" | sha256sum | cut -c1-12)"
  if [ ! -f "$dir/.installed" ]; then
    rm -rf "$dir"
    mkdir -p "$dir"
    npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "$pin" >&2
    touch "$dir/.installed"
  fi
  # Readable by the sandbox's user (uid 65534): a stdio server runs as it.
  chmod -R a+rX "$dir"
  ln -sfn "$dir" "$out/$name"
done
echo "$out"
