"""A PostgreSQL database of a test's own, on the server the tests share (127.0.0.1:5432,
or `LEDGER_TEST_POSTGRES`): made for the test, dropped after. Without a server the test
is skipped, except in CI, where that fails."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg  # type: ignore[import-untyped]
import pytest

SERVER = os.environ.get("LEDGER_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432")


@asynccontextmanager
async def own_database(prefix: str) -> AsyncIterator[str]:
    """The URL of a new database named `{prefix}_<random>`, dropped at the end."""
    try:
        admin = await asyncpg.connect(f"{SERVER}/postgres", timeout=5)
    except (OSError, asyncpg.PostgresError) as error:
        if os.environ.get("CI") == "true":
            pytest.fail(f"PostgreSQL is not running on {SERVER}: {error}")
        pytest.skip(f"no PostgreSQL on {SERVER}")
    name = f"{prefix}_{os.urandom(5).hex()}"
    await admin.execute(f"CREATE DATABASE {name}")
    try:
        yield f"{SERVER}/{name}"
    finally:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        await admin.close()
