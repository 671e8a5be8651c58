#!/usr/bin/env bash
# Creates .venv with the project at the versions uv.lock names (once per change of the
# lock): for the demo (BOOTSTRAP_FOR=demo) the server and its tools, for the tests and
# the benchmarks the dev tools too. A system package the command cannot run without stops
# it, naming the package and the command to install it.
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
# - podman, runc and mmdebstrap (tests): the image is built and run (scripts/build-image.sh);
# - bubblewrap (demo, tests): `gateway eval` runs the code under evaluation in a bwrap
#   sandbox and refuses to run it without one (docs/eval.md).
BOOTSTRAP_FOR=${BOOTSTRAP_FOR:-test}
# What the command at hand cannot run without, and what only one feature needs (named in
# one line when it is missing, with what will not work).
missing_packages() {
  if [ ! -x .venv/bin/python ] && ! "$PYTHON" -c 'import ensurepip' 2>/dev/null; then
    echo "python$PYVER-venv"
  fi
  # The stub looks next to the interpreter (its LIBDIR), then where the loader looks.
  if [ "$BOOTSTRAP_FOR" != bench ] && ! "$PYTHON" -c '
import ctypes.util, os, sys, sysconfig
v = "%d.%d" % sys.version_info[:2]
libdir = sysconfig.get_config_var("LIBDIR") or ""
found = os.path.exists(os.path.join(libdir, f"libpython{v}.so.1.0"))
sys.exit(0 if found or ctypes.util.find_library(f"python{v}") else 1)'; then
    echo "libpython$PYVER"
  fi
  command -v redis-server >/dev/null || echo redis-server
  if [ "$BOOTSTRAP_FOR" != bench ]; then
    command -v bwrap >/dev/null || echo bubblewrap
  fi
  if [ "$BOOTSTRAP_FOR" = test ]; then
    command -v faketime >/dev/null || echo faketime
    command -v promtool >/dev/null || echo prometheus
    # The image's test builds and runs it (scripts/build-image.sh).
    command -v podman >/dev/null || echo podman
    command -v runc >/dev/null || [ -x /usr/sbin/runc ] || echo runc
    command -v mmdebstrap >/dev/null || echo mmdebstrap
  fi
  if [ "$BOOTSTRAP_FOR" = bench ]; then
    command -v wrk >/dev/null || echo wrk
    [ -x /usr/sbin/nginx ] || echo nginx-light
  fi
}
# For the demo, bubblewrap is only `gateway eval`'s (its sandbox): the rest runs without.
optional_for_demo() { [ "$BOOTSTRAP_FOR" = demo ] && [ "$1" = bubblewrap ]; }
mapfile -t missing < <(missing_packages)
apt_output=""
if [ ${#missing[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  # The packages' own services (redis, prometheus, nginx) are not wanted: the demo, the
  # tests and the benchmarks start their own. Debian's policy-rc.d keeps the packages
  # from starting them, so nothing of the user's is stopped by name afterwards.
  policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    policy=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy"
  fi
  apt_output=$( (apt-get update -qq && apt-get install -y -qq "${missing[@]}") 2>&1 >/dev/null) || true
  [ -z "$policy" ] || rm -f "$policy"
  mapfile -t missing < <(missing_packages)
fi
if [ ${#missing[@]} -gt 0 ]; then
  needed=()
  for package in "${missing[@]}"; do
    if optional_for_demo "$package"; then
      echo "bootstrap: $package is not installed: \`gateway eval\` will refuse to run" \
        "(apt-get install $package)" >&2
    else
      needed+=("$package")
    fi
  done
  if [ ${#needed[@]} -gt 0 ]; then
    echo "bootstrap: $BOOTSTRAP_FOR needs ${needed[*]}, which could not be installed." >&2
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
      echo "bootstrap: install them first (as root: apt-get install ${needed[*]})" >&2
    elif [ -n "$apt_output" ]; then
      echo "bootstrap: apt-get said: $(echo "$apt_output" | tail -3)" >&2
      echo "bootstrap: run again once it can (apt-get install ${needed[*]})" >&2
    fi
    exit 1
  fi
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
# registry changes nothing here until the lock is refreshed in a commit. The demo installs
# the server and its tools (requirements/demo.txt); the tests and the benchmarks add the
# dev tools (requirements/dev.txt), which the demo then finds there too.
role=dev
[ "$BOOTSTRAP_FOR" = demo ] && role=demo
lock_hash=$(cat requirements/demo.txt requirements/dev.txt requirements/build.txt setup.py | sha256sum | cut -c1-16)
if [ ! -f ".venv/.installed-$role-$lock_hash" ] && [ ! -f ".venv/.installed-dev-$lock_hash" ]; then
  pip_install() {
    .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-input "$@"
  }
  pip_install --require-hashes --no-deps -r requirements/build.txt -r "requirements/$role.txt"
  # The project itself, editable, built by the locked setuptools (no isolated build
  # environment, which would fetch whatever setuptools is newest).
  pip_install --no-deps --no-build-isolation -e .
  rm -f .venv/.installed-*
  touch ".venv/.installed-$role-$lock_hash"
fi
