"""Where files' bytes are: a local directory (embedded) or an S3-compatible bucket.

Both are written whole from a stream of chunks and read back as one, so that a 200 MB
upload or output file is never one string in memory. An object is written under a
temporary name and renamed (a directory), or completed as one multipart upload (S3):
a reader never sees half of one. The S3 store is `s3_object_store.py`, imported only
when the config names a bucket.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterable, AsyncIterator
from pathlib import Path
from typing import Protocol

# A read's chunks: large enough that a 200 MB file is a few hundred of them.
READ_CHUNK_BYTES = 1024 * 1024


class ObjectStore(Protocol):
    """Named objects: written once from chunks, read as chunks, deleted."""

    async def put(self, key: str, chunks: AsyncIterable[bytes]) -> int:
        """Write object `key` from `chunks`; its size. Nothing is left of it if this raises."""
        ...

    def get(self, key: str) -> AsyncIterator[bytes]:
        """Object `key`'s bytes, in chunks; `FileNotFoundError` when there is none."""
        ...

    async def delete(self, key: str) -> None:
        """Remove object `key` (nothing if it is not there)."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


class DirectoryStore:
    """Objects as files under `root` (made on first write). Blocking file calls run in a
    thread: the event loop never waits on the disk."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        if not key or key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"not an object key: {key!r}")
        return self.root / key

    async def put(self, key: str, chunks: AsyncIterable[bytes]) -> int:
        path = self._path(key)
        await asyncio.to_thread(path.parent.mkdir, parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.urandom(4).hex()}.part")
        handle = await asyncio.to_thread(open, partial, "wb")
        size = 0
        try:
            async for chunk in chunks:
                size += len(chunk)
                await asyncio.to_thread(handle.write, chunk)
            await asyncio.to_thread(handle.close)
            await asyncio.to_thread(os.replace, partial, path)
        except BaseException:
            handle.close()
            partial.unlink(missing_ok=True)
            raise
        return size

    async def get(self, key: str) -> AsyncIterator[bytes]:
        handle = await asyncio.to_thread(open, self._path(key), "rb")
        try:
            while chunk := await asyncio.to_thread(handle.read, READ_CHUNK_BYTES):
                yield chunk
        finally:
            handle.close()

    async def delete(self, key: str) -> None:
        await asyncio.to_thread(self._path(key).unlink, missing_ok=True)

    async def close(self) -> None:
        return None


async def read_all(store: ObjectStore, key: str) -> bytes:
    """Object `key` whole (a batch's input file, read once to make its lines)."""
    return b"".join([chunk async for chunk in store.get(key)])


async def chunks_of(data: bytes) -> AsyncIterator[bytes]:
    """`data` as a stream of one chunk, for `put`."""
    yield data
