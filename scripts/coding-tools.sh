#!/usr/bin/env bash
# Installs the coding tools the end-to-end tests run against the gateway, pinned, into a
# cache shared between runs (one directory per set of versions), and prints the one
# directory that holds their commands (codex, claude, opencode, aider). The npm ones come
# from the npm registry; aider from PyPI, into a virtualenv of its own in the same
# directory (its exact pins conflict with the project's), made by python3 or
# $GATEWAY_TOOLS_PYTHON (aider 0.86 needs Python 3.10 to 3.12). Raise a version here when the
# tools move: the tests then run the new one (tests/e2e/test_coding_tools.py).
set -euo pipefail

TOOLS=(
  "@openai/codex@0.171.0"
  "@anthropic-ai/claude-code@2.1.197"
  "opencode-ai@1.18.33"
)
AIDER="aider-chat==0.86.2"
COMMANDS=(codex claude opencode)

command -v npm >/dev/null || { echo "coding-tools: npm is needed (apt-get install npm)" >&2; exit 1; }
python=${GATEWAY_TOOLS_PYTHON:-python3}
"$python" -c 'import venv' 2>/dev/null \
  || { echo "coding-tools: $python with venv is needed (apt-get install python3-venv)" >&2; exit 1; }
cache=${GATEWAY_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gateway-coding-tools}
dir="$cache/$(printf '%s\n' "${TOOLS[@]}" "$AIDER" | sha256sum | cut -c1-12)"
# One install at a time: scripts/test.sh starts one in the background while the checks
# run, and the tests' own call waits for it here rather than installing beside it.
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
if [ ! -f "$dir/.installed" ]; then
  rm -rf "$dir"  # a half-done install starts over
  mkdir -p "$dir/bin"
  # Their binaries ship in the registry's packages (platform-specific optional ones).
  npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "${TOOLS[@]}" >&2
  "$python" -m venv "$dir/aider"
  "$dir/aider/bin/python" -m pip install --quiet --disable-pip-version-check "$AIDER" >&2
  for name in "${COMMANDS[@]}"; do ln -s "$dir/node_modules/.bin/$name" "$dir/bin/$name"; done
  ln -s "$dir/aider/bin/aider" "$dir/bin/aider"
  touch "$dir/.installed"
fi
echo "$dir/bin"
