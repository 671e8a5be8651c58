#!/usr/bin/env bash
# The one command that runs the demo: two Triton servers (simulated LLMs), Redis, the gateway.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BOOTSTRAP_FOR=demo source scripts/bootstrap.sh

exec .venv/bin/gateway demo "$@"
