# The gateway image: `gateway serve`, nothing else. Triton runs elsewhere (its own pods or
# hosts) and so does Redis (GATEWAY_REDIS_URL), so neither the `sim` extra (the simulated
# models of `gateway demo`, which ship a tritonserver binary) nor redis-server is in here.
#
#   docker build -t REGISTRY/inference-gateway:TAG .
#
# docs/deployment.md ("The image") says what is inside; tests/unit/deploy/test_image.py
# lints this file with hadolint and runs the same entrypoint in a venv laid out as below.
#
# The base is pinned by tag: Python 3.11 (pyproject's requires-python) on Debian 12. The
# tag still moves with Python's patch releases and Debian's security updates; pinning the
# digest (python:3.11-slim-bookworm@sha256:...) would fix it byte for byte, but no
# container registry is reachable where this was written, so the digest could not be
# resolved. Pass it with --build-arg PYTHON_IMAGE=... where it can. Both stages must use
# the same image: the venv's `python` is a symlink to the base image's interpreter.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- builder: the project's wheel, installed with its runtime dependencies into a venv ---
FROM ${PYTHON_IMAGE} AS builder

# Every runtime dependency has a manylinux wheel for CPython 3.11 (none is compiled), so
# the builder has no compilers either; --only-binary makes a dependency that ever needs
# one fail here, loudly, instead of pulling in a toolchain.
WORKDIR /src
# Where a proxy re-signs TLS, pip needs that CA bundle: mounted at build time
# (`--volume`) and named here, never copied into a layer (scripts/build-image.sh).
ARG PIP_CERT
COPY requirements/runtime.txt requirements/build.txt ./requirements/
COPY pyproject.toml setup.py README.md ./
COPY gateway ./gateway
# The control plane runs in the server's process when gateway.yaml names a cluster file;
# the offline tools (gateway_tools/) are not in the image.
COPY gateway_control ./gateway_control
COPY lua ./lua
# The venv gets no pip of its own: the builder's pip installs into it (--python). What
# goes in is uv.lock's runtime set, exported with hashes (requirements/runtime.txt, made
# by scripts/lock.sh): pip resolves nothing and checks every file, so the image holds the
# versions CI tested. The wheel is built by the locked setuptools (no isolated build,
# which would take the newest), and carries the top-level lua/ as gateway/lua/
# (setup.py), where gateway.storage.scripts finds the Redis scripts in an installed gateway.
# The tools that build go into a venv of their own (/opt/build), never into the base's
# Python: a distribution's Python refuses that (PEP 668), and it keeps the image's venv to
# what runs.
RUN python -m venv --without-pip /opt/venv \
    && python -m venv /opt/build \
    && /opt/build/bin/pip install --no-cache-dir --disable-pip-version-check \
        --require-hashes --no-deps --only-binary=:all: -r requirements/build.txt \
    && /opt/build/bin/pip wheel --no-cache-dir --disable-pip-version-check --no-deps \
        --no-build-isolation --wheel-dir /tmp/wheels . \
    && /opt/build/bin/pip --python /opt/venv/bin/python install --no-cache-dir \
        --disable-pip-version-check --require-hashes --no-deps --only-binary=:all: \
        -r requirements/runtime.txt \
    && /opt/build/bin/pip --python /opt/venv/bin/python install --no-cache-dir \
        --disable-pip-version-check --no-deps /tmp/wheels/inference_gateway-*.whl \
    && rm -rf /tmp/wheels

# --- the image: the venv, the default configs, a user without privileges ---
FROM ${PYTHON_IMAGE}

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    GATEWAY_OPS_HOST=0.0.0.0
# PYTHONDONTWRITEBYTECODE: the root filesystem is read-only in Kubernetes; the venv was
# byte-compiled when pip installed it. GATEWAY_OPS_HOST: the shipped config keeps the ops
# listener (/metrics, /admin/*) on 127.0.0.1 otherwise, out of Prometheus' reach.

# uid/gid 10001: the Kubernetes manifests run the pod as this user (deploy/kubernetes).
RUN groupadd --system --gid 10001 gateway \
    && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/gateway \
        --shell /usr/sbin/nologin gateway

# Owned by root, read-only to the gateway user: the process cannot change its own code or
# configuration. The configs are the shipped demo ones (Redis at GATEWAY_REDIS_URL, the
# Triton nodes at NODE_A_URL and NODE_B_URL); Kubernetes mounts its own over this path.
COPY --from=builder /opt/venv /opt/venv
COPY config/gateway.yaml config/tenants.yaml config/cluster.yaml /etc/gateway/config/

USER 10001:10001
WORKDIR /home/gateway

# The API on 8080; /metrics and /admin/* only on the ops listener, 8081, which the
# deployment keeps from the API's clients (config/gateway.yaml: server.ops).
EXPOSE 8080 8081

# For `docker run` and compose; Kubernetes ignores it and uses its own probes. No curl in
# the image: python asks the ops listener's /livez on 127.0.0.1 (which 0.0.0.0 includes),
# bypassing any HTTP_PROXY the container is given.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; u.build_opener(u.ProxyHandler({})).open('http://127.0.0.1:%s/livez' % os.environ.get('GATEWAY_OPS_PORT', '8081'), timeout=4)"]

ENTRYPOINT ["gateway"]
CMD ["serve", "--config", "/etc/gateway/config/gateway.yaml", "--host", "0.0.0.0", "--port", "8080"]
