#!/usr/bin/env bash
# Creates .venv with the project and its dev extras (once per change of pyproject.toml).
# Sourced by scripts/demo.sh and scripts/test.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  echo "bootstrap: Python 3.11 is required (found $("$PYTHON" --version 2>&1))" >&2
  exit 1
fi

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e '.[dev]'
  rm -f .venv/.installed-*
  touch "$stamp"
fi

# The tests want a real redis-server (the demo too), faketime (clock-skew tests) and
# prometheus/promtool (alert rules, scraping); install them where we may (root on Debian).
missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v faketime >/dev/null || missing+=(faketime)
command -v promtool >/dev/null || missing+=(prometheus)
# The benchmarks (loadtest/bench, loadtest/profile.py) also want wrk and nginx.
if [ "${BOOTSTRAP_BENCH:-}" = 1 ]; then
  command -v wrk >/dev/null || missing+=(wrk)
  [ -x /usr/sbin/nginx ] || missing+=(nginx-light)
fi
if [ ${#missing[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  (apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null) \
    || echo "bootstrap: could not install ${missing[*]}" >&2
  # The tests start their own servers; a daemon the packages started is not wanted.
  case " ${missing[*]} " in *" prometheus "*) pkill -x prometheus || true ;; esac
  case " ${missing[*]} " in *" nginx-light "*) pkill -x nginx || true ;; esac
fi
