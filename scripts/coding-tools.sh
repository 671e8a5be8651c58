#!/usr/bin/env bash
# Installs the coding tools asked for (default: all four, as the end-to-end tests run
# them against the gateway), pinned, into a cache shared between runs (one directory per
# tool and version), and prints the one directory that holds their commands:
#
#   scripts/coding-tools.sh [codex] [claude] [opencode] [aider]
#
# The npm ones come from the npm registry; aider from PyPI, into a virtualenv of its own
# (its exact pins conflict with the project's), made by python3 or $GATEWAY_TOOLS_PYTHON
# (aider 0.86 needs Python 3.10 to 3.12). Raise a version here when the tools move: the
# tests then run the new one (tests/e2e/test_coding_tools.py).
set -euo pipefail

declare -A PINS=(
  [codex]="@openai/codex@0.171.0"
  [claude]="@anthropic-ai/claude-code@2.1.197"
  [opencode]="opencode-ai@1.18.33"
  [aider]="aider-chat==0.86.2"
)
ALL=(codex claude opencode aider)
wanted=("$@")
[ ${#wanted[@]} -gt 0 ] || wanted=("${ALL[@]}")
for tool in "${wanted[@]}"; do
  [ -n "${PINS[$tool]:-}" ] \
    || { echo "coding-tools: no tool '$tool' (choose from ${ALL[*]})" >&2; exit 2; }
done

if [[ " ${wanted[*]} " != " aider " ]]; then
  command -v npm >/dev/null || { echo "coding-tools: npm is needed (apt-get install npm)" >&2; exit 1; }
fi
python=${GATEWAY_TOOLS_PYTHON:-python3}
if [[ " ${wanted[*]} " == *" aider "* ]]; then
  "$python" -c 'import venv' 2>/dev/null \
    || { echo "coding-tools: $python with venv is needed (apt-get install python3-venv)" >&2; exit 1; }
fi
cache=${GATEWAY_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gateway-coding-tools}
# One directory of commands for this set of pins: each tool installed is linked there.
bin="$cache/bin-$(printf '%s\n' "${PINS[@]}" | sort | sha256sum | cut -c1-12)"
# One install at a time: scripts/test.sh starts one in the background while the checks
# run, and the tests' own call waits for it here rather than installing beside it.
mkdir -p "$cache" "$bin"
exec 9>"$cache/.lock"
flock 9
for tool in "${wanted[@]}"; do
  pin=${PINS[$tool]}
  dir="$cache/$tool-$(printf '%s' "$pin" | sha256sum | cut -c1-12)"
  if [ ! -f "$dir/.installed" ]; then
    rm -rf "$dir"  # a half-done install starts over
    mkdir -p "$dir"
    if [ "$tool" = aider ]; then
      "$python" -m venv "$dir/venv"
      "$dir/venv/bin/python" -m pip install --quiet --disable-pip-version-check "$pin" >&2
    else
      # Their binaries ship in the registry's packages (platform-specific optional ones).
      npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "$pin" >&2
    fi
    touch "$dir/.installed"
  fi
  if [ "$tool" = aider ]; then
    ln -sfn "$dir/venv/bin/aider" "$bin/aider"
  else
    ln -sfn "$dir/node_modules/.bin/$tool" "$bin/$tool"
  fi
done
echo "$bin"
