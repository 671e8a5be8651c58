#!/usr/bin/env bash
# Creates .venv with the project and its dev extras at the versions uv.lock names (once per
# change of the lock).
# Sourced by scripts/demo.sh and scripts/test.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  echo "bootstrap: Python 3.11 is required (found $("$PYTHON" --version 2>&1))" >&2
  exit 1
fi
PYVER=3.11

# System packages, installed where we may (root on Debian) before the venv needs them,
# and only those the command at hand needs (BOOTSTRAP_FOR: demo, test or bench):
# - python3.11-venv: Debian's python3.11 cannot create a venv without it (no ensurepip);
# - libpython3.11: the shared libpython that triton-sim's Python backend stub links;
# - redis-server (demo, tests, bench); faketime (clock-skew tests) and prometheus/promtool
#   (alert rules, scraping) for the tests; wrk and nginx for the benchmarks;
# - bubblewrap (demo, tests): `gateway eval` runs the code under evaluation in a bwrap
#   sandbox and refuses to run it without one (docs/eval.md).
BOOTSTRAP_FOR=${BOOTSTRAP_FOR:-test}
missing=()
if [ ! -x .venv/bin/python ] && ! "$PYTHON" -c 'import ensurepip' 2>/dev/null; then
  missing+=("python$PYVER-venv")
fi
# The stub looks next to the interpreter (its LIBDIR), then where the loader looks.
if [ "$BOOTSTRAP_FOR" != bench ] && ! "$PYTHON" -c '
import ctypes.util, os, sys, sysconfig
v = "%d.%d" % sys.version_info[:2]
libdir = sysconfig.get_config_var("LIBDIR") or ""
found = os.path.exists(os.path.join(libdir, f"libpython{v}.so.1.0"))
sys.exit(0 if found or ctypes.util.find_library(f"python{v}") else 1)'; then
  missing+=("libpython$PYVER")
fi
command -v redis-server >/dev/null || missing+=(redis-server)
if [ "$BOOTSTRAP_FOR" != bench ]; then
  command -v bwrap >/dev/null || missing+=(bubblewrap)
fi
if [ "$BOOTSTRAP_FOR" = test ]; then
  command -v faketime >/dev/null || missing+=(faketime)
  command -v promtool >/dev/null || missing+=(prometheus)
fi
if [ "$BOOTSTRAP_FOR" = bench ]; then
  command -v wrk >/dev/null || missing+=(wrk)
  [ -x /usr/sbin/nginx ] || missing+=(nginx-light)
fi
if [ ${#missing[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  # The packages' own services (redis, prometheus, nginx) are not wanted: the demo, the
  # tests and the benchmarks start their own. Debian's policy-rc.d keeps the packages
  # from starting them, so nothing of the user's is stopped by name afterwards.
  policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    policy=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy"
  fi
  (apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null) \
    || echo "bootstrap: could not install ${missing[*]}" >&2
  [ -z "$policy" ] || rm -f "$policy"
elif [[ " ${missing[*]} " == *" libpython$PYVER "* ]]; then
  echo "bootstrap: triton-sim (demo, tests) needs libpython$PYVER:" \
    "apt-get install libpython$PYVER" >&2
fi

if [ ! -x .venv/bin/python ]; then
  if ! "$PYTHON" -c 'import ensurepip' 2>/dev/null; then
    echo "bootstrap: $PYTHON cannot create a virtual environment;" \
      "install python$PYVER-venv (apt-get install python$PYVER-venv)" >&2
    exit 1
  fi
  "$PYTHON" -m venv .venv
fi
# The venv holds exactly what uv.lock names (exported with hashes by scripts/lock.sh):
# pip installs those files, checks every hash and resolves nothing, so a release on the
# registry changes nothing here until the lock is refreshed in a commit.
stamp=.venv/.installed-$(cat requirements/dev.txt requirements/build.txt setup.py | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  pip_install() {
    .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-input "$@"
  }
  pip_install --require-hashes --no-deps -r requirements/build.txt -r requirements/dev.txt
  # The project itself, editable, built by the locked setuptools (no isolated build
  # environment, which would fetch whatever setuptools is newest).
  pip_install --no-deps --no-build-isolation -e .
  rm -f .venv/.installed-*
  touch "$stamp"
fi
