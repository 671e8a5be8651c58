"""Fixtures shared by every test layer: a real redis-server on a free port."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from gateway.storage.redis_client import EMBEDDED_URL
from gateway_tools.dev.processes import free_port, redis_server_path, start_redis, stop
from tests.redis_cluster import redis_cluster

__all__ = ["redis_cluster", "redis_url"]


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A redis-server of the tests' own; the shared one on 6379 is never touched.

    Without redis-server the tests fall back to the embedded fakeredis, except in CI
    (CI=true), where a missing server is a failure.
    """
    if redis_server_path() is None:
        if os.environ.get("CI") == "true":
            pytest.fail("redis-server is not installed; CI requires a real Redis")
        yield EMBEDDED_URL
        return
    process = start_redis(free_port())
    port = process.args[2]  # type: ignore[index]
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        stop(process)
