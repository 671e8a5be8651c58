#!/usr/bin/env bash
# The one command that runs every check: lint, format, types, tests.
# With CI=true a missing redis-server fails the tests instead of falling back to fakeredis.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/bootstrap.sh
# The whole suite runs the pinned coding tools and MCP servers: their download
# (network-bound) starts now, beside the checks and the first tests, and their fixtures
# wait for it (both scripts take one lock).
if [ $# -eq 0 ]; then
  (scripts/coding-tools.sh && scripts/mcp-tools.sh) >/dev/null 2>&1 &
fi

.venv/bin/ruff check gateway gateway_control gateway_tools tests loadtest deploy
.venv/bin/ruff format --check gateway gateway_control gateway_tools tests loadtest deploy
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
