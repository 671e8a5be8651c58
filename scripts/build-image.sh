#!/usr/bin/env bash
# Builds the gateway's image with podman and prints its name (docs/deployment.md, "The
# image"). Where no registry can be reached (these machines: ../shared/notes), the base
# is made from Debian's own packages with mmdebstrap (Python 3.11, as the official
# python:3.11-slim-bookworm) and kept for the next build; elsewhere pass
# PYTHON_IMAGE=python:3.11-slim-bookworm (or any base with python 3.11 and venv).
#
#   scripts/build-image.sh [TAG]          TAG: localhost/inference-gateway:dev by default
#
# The host's CA bundle is mounted for pip (where a proxy re-signs TLS), never copied into
# a layer. podman runs with runc and the settings in deploy/podman/containers.conf.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
TAG=${1:-localhost/inference-gateway:dev}
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/deploy/podman/containers.conf}
PODMAN=(podman --runtime runc)
for tool in podman runc; do
  command -v "$tool" >/dev/null || { echo "build-image: $tool is needed (apt-get install podman runc)" >&2; exit 1; }
done
if [ -z "${PYTHON_IMAGE:-}" ]; then
  PYTHON_IMAGE=localhost/bookworm-py:11
  if ! "${PODMAN[@]}" image exists "$PYTHON_IMAGE"; then
    command -v mmdebstrap >/dev/null \
      || { echo "build-image: mmdebstrap is needed to make the base (apt-get install mmdebstrap), or set PYTHON_IMAGE" >&2; exit 1; }
    base=$(mktemp -d)
    trap 'rm -rf "$base"' EXIT
    mmdebstrap --quiet --variant=minbase \
      --include=python3,python3-venv,python3-pip,python-is-python3,ca-certificates \
      bookworm "$base/base.tar" >&2
    "${PODMAN[@]}" import --quiet "$base/base.tar" "$PYTHON_IMAGE" >/dev/null
  fi
fi
cert=()
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  cert=(--build-arg PIP_CERT=/etc/ssl/certs/ca-certificates.crt
        --volume /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
fi
# The docker format keeps the HEALTHCHECK (OCI's has none).
"${PODMAN[@]}" build --quiet --format docker --network host \
  --build-arg PYTHON_IMAGE="$PYTHON_IMAGE" "${cert[@]}" --tag "$TAG" . >/dev/null
echo "$TAG"
