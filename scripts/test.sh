#!/usr/bin/env bash
# The one command that runs every check: lint, format, types, tests.
# With CI=true a missing redis-server fails the tests instead of falling back to fakeredis.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/bootstrap.sh

.venv/bin/ruff check gateway tests loadtest deploy
.venv/bin/ruff format --check gateway tests loadtest deploy
.venv/bin/mypy gateway
.venv/bin/python -m pytest "$@"
