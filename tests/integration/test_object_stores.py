"""Where batch files' bytes go: a directory, and an S3-compatible bucket served by a real
S3-compatible server process (`moto_server`). Each is written whole or not at all."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
from aiobotocore.session import get_session  # type: ignore[import-untyped]

from gateway.batches.object_store import DirectoryStore, ObjectStore, read_all
from gateway.batches.s3_object_store import S3Store
from gateway.config.schema import S3Store as S3Settings
from gateway_tools.dev.processes import free_port

BUCKET = "gateway-test"


@contextmanager
def moto_server() -> Iterator[str]:
    """An S3-compatible server process on a free port: its URL."""
    binary = shutil.which("moto_server", path=str(Path(sys.executable).parent))
    assert binary is not None, "moto_server is a dev dependency (moto[s3])"
    port = free_port()
    process = subprocess.Popen(
        [binary, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "moto_server did not start"
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture(scope="module")
def s3_server() -> Iterator[str]:
    with moto_server() as url:
        yield url


@pytest.fixture(params=["directory", "s3"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[ObjectStore]:
    if request.param == "directory":
        yield DirectoryStore(tmp_path / "files")
        return
    endpoint = request.getfixturevalue("s3_server")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    async with get_session().create_client(
        "s3", region_name="us-east-1", endpoint_url=endpoint
    ) as client:
        with suppress(client.exceptions.BucketAlreadyOwnedByYou):
            await client.create_bucket(Bucket=BUCKET)
    opened = S3Store(S3Settings(bucket=BUCKET, endpoint_url=endpoint, prefix=f"t{os.getpid()}/"))
    try:
        yield opened
    finally:
        await opened.close()


async def _chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def test_an_object_is_read_back_as_written_large_or_small(store: ObjectStore) -> None:
    large = os.urandom(1024 * 1024) * 20  # 20 MiB: three parts of a multipart upload
    assert await store.put(
        "acme/big", _chunks(*(large[i : i + 300_000] for i in range(0, len(large), 300_000)))
    ) == len(large)
    assert await store.put("acme/small", _chunks(b'{"a": 1}\n', b'{"b": 2}\n')) == 18
    assert await read_all(store, "acme/big") == large
    assert await read_all(store, "acme/small") == b'{"a": 1}\n{"b": 2}\n'
    await store.delete("acme/small")
    with pytest.raises(FileNotFoundError):
        await read_all(store, "acme/small")
    await store.delete("acme/small")  # gone already: nothing


async def test_a_write_that_fails_midway_leaves_nothing(store: ObjectStore) -> None:
    async def failing() -> AsyncIterator[bytes]:
        yield os.urandom(9 * 1024 * 1024)  # one part in
        raise ValueError("the upload was refused")

    with pytest.raises(ValueError):
        await store.put("acme/half", failing())
    with pytest.raises(FileNotFoundError):
        await read_all(store, "acme/half")


def test_a_key_cannot_leave_the_directory(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path)
    for key in ("../etc/passwd", "/etc/passwd", "", "a/../../b"):
        with pytest.raises(ValueError):
            store._path(key)
