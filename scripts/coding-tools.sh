#!/usr/bin/env bash
# Installs the coding tools the end-to-end tests run against the gateway, pinned, from
# the npm registry, into a cache shared between runs (one directory per set of versions),
# and prints the directory of their commands. Raise a version here when the tools move:
# the tests then run the new one (tests/e2e/test_coding_tools.py).
set -euo pipefail

TOOLS=(
  "@openai/codex@0.171.0"
  "@anthropic-ai/claude-code@2.1.197"
)

command -v npm >/dev/null || { echo "coding-tools: npm is needed (apt-get install npm)" >&2; exit 1; }
cache=${GATEWAY_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gateway-coding-tools}
dir="$cache/$(printf '%s\n' "${TOOLS[@]}" | sha256sum | cut -c1-12)"
if [ ! -f "$dir/.installed" ]; then
  mkdir -p "$dir"
  # Their binaries ship in the registry's packages (platform-specific optional ones).
  npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "${TOOLS[@]}" >&2
  touch "$dir/.installed"
fi
echo "$dir/node_modules/.bin"
