#!/usr/bin/env bash
# Refreshes uv.lock from pyproject.toml, then exports the hashed requirement files that
# every install reads (docs/development.md, "Dependencies"):
#   requirements/runtime.txt  the gateway alone: the image (Dockerfile)
#   requirements/demo.txt     runtime and the tools extra (control plane, simulated models,
#                             the demo's client): bootstrap.sh for the demo
#   requirements/dev.txt      all of that and the dev tools: bootstrap.sh (the test command,
#                             CI, the benchmarks)
#   requirements/build.txt    what builds the project's own wheel (setuptools)
#
#   scripts/lock.sh             keeps every locked version pyproject.toml still allows
#   scripts/lock.sh --upgrade   takes the newest releases pyproject.toml's ranges allow
#   scripts/lock.sh --upgrade-package NAME   one package only
#
# tests/unit/deploy/test_lock.py fails while uv.lock, these files and pyproject.toml disagree.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
UV=${UV:-.venv/bin/uv}
"$UV" lock --python 3.11 "$@"
export_lock() {
  "$UV" export --quiet --frozen --no-emit-project --no-default-groups "$@"
}
export_lock --output-file requirements/runtime.txt
export_lock --extra tools --output-file requirements/demo.txt
export_lock --extra dev --output-file requirements/dev.txt
export_lock --only-group build --output-file requirements/build.txt
