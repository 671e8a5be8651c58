#!/usr/bin/env bash
# The lower bounds of pyproject.toml's ranges, tested: a venv (.venv-lowest) where every
# direct runtime dependency is at the oldest release its range allows (uv's
# --resolution lowest-direct, from wheels only: a bound with no wheel for CPython 3.11
# is not a bound anyone installs), the test tools added without moving any of them, then
# the unit and in-process suites. For people who install the package into an environment of
# their own, whose resolver may pick any version in the ranges; the test command and the
# image use uv.lock. Run it after widening or raising a range (docs/development.md).
#
#   scripts/test-lowest.sh [pytest arguments]   (default: tests/unit tests/inprocess but
#                                               tests/unit/deploy, which checks the lock)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/bootstrap.sh
UV=.venv/bin/uv
venv=.venv-lowest
rm -rf "$venv"
"$UV" venv --quiet --seed --python 3.11 "$venv"  # --seed: pip, which tests call
"$UV" pip install --quiet --python "$venv/bin/python" --resolution lowest-direct --no-build -e .
# The runtime as resolved above stays as it is while the test tools are added: the dev
# extra but the simulated models (the `sim` extra: nvidia-pytriton's tritonclient[http])
# and Locust, whose pins conflict with the lowest tritonclient's geventhttpclient, and
# the agent frameworks, which need a newer pydantic; the tests that use them are e2e
# ones, not run here.
"$UV" pip freeze --python "$venv/bin/python" --exclude-editable > "$venv/runtime-lowest.txt"
"$venv/bin/python" - > "$venv/test-tools.txt" <<'PY'
import tomllib
dev = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["dev"]
# Clients used only by e2e tests, whose newest releases need newer pydantic than 2.7.
left_out = ("inference-gateway[", "locust", "openai-agents", "langchain-openai")
print("\n".join(r for r in dev if not r.startswith(left_out)))
PY
"$UV" pip install --quiet --python "$venv/bin/python" --no-build \
  -c "$venv/runtime-lowest.txt" -r "$venv/test-tools.txt" -r requirements/build.txt
echo "test-lowest: pyproject.toml's runtime dependencies at their lowest:"
"$venv/bin/python" - "$venv/runtime-lowest.txt" <<'PY'
import sys, tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
direct = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}
for line in open(sys.argv[1]):
    name, _, version = line.strip().partition("==")
    if canonicalize_name(name) in direct:
        print(f"  {name}=={version}")
PY
# tests/unit/deploy checks the image and the lock, which are uv.lock's versions by design.
if [ $# -eq 0 ]; then
  set -- tests/unit tests/inprocess --ignore=tests/unit/deploy
fi
"$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
